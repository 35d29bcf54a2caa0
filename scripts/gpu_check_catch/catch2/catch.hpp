// A stand-in for the part of Catch2 that accelkit's C++ conformance kit
// and the cudart tests use (TEST_CASE, CHECK, REQUIRE, STATIC_REQUIRE, FAIL,
// FAIL_CHECK, WARN, INFO, CHECK_NOTHROW, Approx), for scripts/gpu_check on
// a machine without Catch2: it runs every test case in declaration order
// (the kit needs that), prints each failure, and exits 1 if any failed. Not
// Catch2: no tags, sections, or command line (any argument is ignored).
#pragma once

#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace gpu_check_catch {
struct Case {
  const char* name;
  void (*fn)();
};
inline std::vector<Case>& cases() {
  static std::vector<Case> c;
  return c;
}
inline int& failures() {
  static int n = 0;
  return n;
}
struct Abort {};  // REQUIRE or FAIL ends the test case
struct Register {
  Register(const char* name, void (*fn)()) { cases().push_back({name, fn}); }
};
template <class T>
std::string text(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::printf("%s:%d: FAILED: %s\n", file, line, what.c_str());
}
inline int run_all() {
  int failed_cases = 0;
  for (const Case& c : cases()) {
    int before = failures();
    try {
      c.fn();
    } catch (const Abort&) {
    } catch (const std::exception& e) {
      fail(c.name, 0, std::string("threw: ") + e.what());
    } catch (...) {
      fail(c.name, 0, "threw an unknown exception");
    }
    bool ok = failures() == before;
    failed_cases += ok ? 0 : 1;
    std::printf("%s %s\n", ok ? "passed" : "FAILED", c.name);
  }
  std::printf("%zu test cases, %d failed\n", cases().size(), failed_cases);
  return failed_cases ? 1 : 0;
}
}  // namespace gpu_check_catch

namespace Catch {
class Approx {
 public:
  explicit Approx(double v) : v_(v) {}
  Approx& epsilon(double e) {
    eps_ = e;
    return *this;
  }
  Approx& margin(double m) {
    margin_ = m;
    return *this;
  }
  friend bool operator==(double a, const Approx& b) {
    return std::fabs(a - b.v_) <= b.margin_ + b.eps_ * (std::fabs(b.v_) + std::fabs(a));
  }
  friend bool operator==(const Approx& b, double a) { return a == b; }
  friend bool operator!=(double a, const Approx& b) { return !(a == b); }
  friend std::ostream& operator<<(std::ostream& o, const Approx& a) { return o << "Approx(" << a.v_ << ")"; }

 private:
  double v_;
  double eps_ = 1e-5;
  double margin_ = 0;
};
}  // namespace Catch

#define GPU_CHECK_CATCH_CAT2_(a, b) a##b
#define GPU_CHECK_CATCH_CAT_(a, b) GPU_CHECK_CATCH_CAT2_(a, b)
// One id per test case (__COUNTER__: the conformance kit declares all of its
// cases from one macro expansion, on one line).
#define TEST_CASE(name, ...) \
  GPU_CHECK_CATCH_CASE_(GPU_CHECK_CATCH_CAT_(gpu_check_case_, __COUNTER__), name)
#define GPU_CHECK_CATCH_CASE_(fn, name)                                            \
  static void fn();                                                                \
  static ::gpu_check_catch::Register GPU_CHECK_CATCH_CAT_(fn, _registered)(name, &fn); \
  static void fn()
#define CHECK(...) \
  ((__VA_ARGS__) ? void() : ::gpu_check_catch::fail(__FILE__, __LINE__, "CHECK(" #__VA_ARGS__ ")"))
#define REQUIRE(...)                                                             \
  do {                                                                           \
    if (!(__VA_ARGS__)) {                                                        \
      ::gpu_check_catch::fail(__FILE__, __LINE__, "REQUIRE(" #__VA_ARGS__ ")"); \
      throw ::gpu_check_catch::Abort{};                                          \
    }                                                                            \
  } while (0)
#define STATIC_REQUIRE(...) static_assert(__VA_ARGS__, "STATIC_REQUIRE(" #__VA_ARGS__ ")")
#define CHECK_FALSE(...) CHECK(!(__VA_ARGS__))
#define REQUIRE_FALSE(...) REQUIRE(!(__VA_ARGS__))
#define CHECK_NOTHROW(...)                                                                \
  do {                                                                                    \
    try {                                                                                 \
      __VA_ARGS__;                                                                        \
    } catch (const std::exception& gpu_check_e_) {                                        \
      ::gpu_check_catch::fail(__FILE__, __LINE__,                                         \
                              std::string("CHECK_NOTHROW threw: ") + gpu_check_e_.what()); \
    }                                                                                     \
  } while (0)
#define FAIL_CHECK(msg) ::gpu_check_catch::fail(__FILE__, __LINE__, ::gpu_check_catch::text(msg))
#define FAIL(msg)                                                               \
  do {                                                                          \
    ::gpu_check_catch::fail(__FILE__, __LINE__, ::gpu_check_catch::text(msg)); \
    throw ::gpu_check_catch::Abort{};                                           \
  } while (0)
#define WARN(msg) std::printf("warning: %s\n", ::gpu_check_catch::text(msg).c_str())
#define INFO(msg) (void)(msg)
#define SUCCEED(...) (void)0

#ifndef GPU_CHECK_CATCH_NO_MAIN
int main() { return ::gpu_check_catch::run_all(); }
#endif
