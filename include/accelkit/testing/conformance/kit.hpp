// accelkit: the conformance kit's machinery (testing/conformance.hpp is the
// header to include): one check's Verdict, the kit's Conformance<R>, which
// runs a check and records it in the report, and CheckTools<R>, what the
// check groups (testing/conformance/<group>.hpp) share.
#pragma once

#include <accelkit/accelkit.hpp>
#include <accelkit/testing/conformance/peer.hpp>
#include <accelkit/testing/observed.hpp>
#include <accelkit/testing/report.hpp>

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

// One check's verdict while it runs: the first broken rule fails it.
class Verdict {
 public:
  // Fails the check with `message` unless `ok`. Returns ok.
  bool require(bool ok, std::string message) {
    if (!ok && status_ == CheckStatus::pass) {
      status_ = CheckStatus::fail;
      message_ = std::move(message);
    }
    return ok;
  }
  void skip(std::string why) {
    if (status_ == CheckStatus::pass) {
      status_ = CheckStatus::skip;
      message_ = std::move(why);
    }
  }
  CheckStatus status() const noexcept { return status_; }
  const std::string& message() const noexcept { return message_; }

 private:
  CheckStatus status_ = CheckStatus::pass;
  std::string message_;
};

template <class R>
class Conformance {
 public:
  using Observed = testing::Observed<R>;
  using SdkBackend = Backend<Observed>;
  using Factory = std::function<std::unique_ptr<SdkBackend>()>;

  static Conformance& instance() {
    static Conformance kit;
    return kit;
  }
  // How a backend over the observed runtime is made (default: R's default
  // constructor).
  void set_factory(Factory make) { factory_ = std::move(make); }
  ConformanceReport& report() { return report_; }

  // Runs one check and returns its result.
  CheckResult evaluate(const char* group, const char* name, const char* rule,
                       void (*check)(Conformance&, Verdict&)) {
    if (const auto& role = PeerRole::requested()) {
      serve(*role, group, name, check);
      return {group, name, rule, CheckStatus::skip, "passed over by the kit's second process", 0};
    }
    Verdict v;
    auto start = std::chrono::steady_clock::now();
    if (skipped(group)) {
      v.skip(fmt::format("group {} skipped by ACCELKIT_CONFORMANCE_SKIP", group));
    } else {
      try {
        check(*this, v);
      } catch (const std::exception& e) {
        v.require(false, fmt::format("threw: {}", e.what()));
      }
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return {group, name, rule, v.status(), v.message(), seconds};
  }
  // The same, recorded in the report (written when the program ends),
  // failing the Catch2 test case if the check failed.
  void run(const char* group, const char* name, const char* rule,
           void (*check)(Conformance&, Verdict&)) {
    if (const auto& role = PeerRole::requested()) return serve(*role, group, name, check);
    if (!write_report_) require_writable_report();
    CheckResult r = evaluate(group, name, rule, check);
    write_report_ = true;
    report_.add(r);
    if (r.status == CheckStatus::fail) FAIL_CHECK(fmt::format("{}: {}", rule, r.message));
    else if (r.status == CheckStatus::skip) WARN(fmt::format("skipped: {}", r.message));
  }

  // The kit's backend over the observed runtime, made at the first use.
  SdkBackend& backend() {
    if (!backend_) backend_ = factory_();
    return *backend_;
  }
  Observed& runtime() { return backend().runtime(); }
  // A new backend over a new runtime (for checks of discovery).
  std::unique_ptr<SdkBackend> fresh_backend() { return factory_(); }
  int devices() { return backend().device_count(); }

  // In the process started as a check's peer (Note [The kit's second
  // process]), its channel to the process that started it, while the check
  // runs; nullptr everywhere else.
  PeerChannel* peer() noexcept { return peer_; }
  // What names R to a peer process (the same program: the same name).
  static std::string runtime_type() { return typeid(R).name(); }

  ~Conformance() {
    if (!write_report_) return;
    int n = 0;
    try {
      n = backend_ ? backend_->device_count() : 0;
    } catch (...) {
    }
    std::string why;
    if (report_.write(report_path(), R::name, n, why)) return;
    std::fputs(fmt::format("accelkit conformance kit ({}): the report was not written: {}\n",
                           R::name, why).c_str(),
               stderr);
    // The program's exit status was decided when Catch2's main returned;
    // ending here is the one way left to make it a failure.
    std::fflush(nullptr);
    std::_Exit(1);
  }

 private:
  Conformance() = default;
  static std::string report_path() {
    const char* p = std::getenv("ACCELKIT_CONFORMANCE_REPORT");
    return p ? p : "accelkit_conformance_" + std::string(R::name) + ".json";
  }
  // Before the first check: a report that could not be written at the end
  // would leave a run that looks passed and has no report.
  static void require_writable_report() {
    std::string why;
    if (ConformanceReport::writable(report_path(), why)) return;
    std::fputs(fmt::format("accelkit conformance kit ({}): cannot write the report ({}): {}; "
                           "no check run\n",
                           R::name,
                           std::getenv("ACCELKIT_CONFORMANCE_REPORT")
                               ? "ACCELKIT_CONFORMANCE_REPORT"
                               : "the default path",
                           why)
                   .c_str(),
               stderr);
    std::fflush(nullptr);
    std::exit(2);
  }
  // In a process started as a peer: the check the role names runs as the
  // peer, and the process ends; every other check is passed over.
  void serve(const PeerRole& role, const char* group, const char* name,
             void (*check)(Conformance&, Verdict&)) {
    if (!role.names(group, name, runtime_type())) return;
    PeerChannel channel(role.fd, "first process");
    peer_ = &channel;
    int status = 0;
    try {
      Verdict v;
      check(*this, v);
      channel.send("done");
    } catch (const std::exception& e) {
      status = 1;
      std::string what = e.what();
      std::replace(what.begin(), what.end(), '\n', ' ');
      try {
        channel.send("error: " + what);
      } catch (...) {
        // The first process is gone: nobody to tell.
      }
    }
    std::fflush(nullptr);
    std::_Exit(status);
  }
  static bool skipped(std::string_view group) {
    const char* s = std::getenv("ACCELKIT_CONFORMANCE_SKIP");
    if (!s) return false;
    std::string_view list(s);
    while (!list.empty()) {
      std::size_t comma = list.find(',');
      if (list.substr(0, comma) == group) return true;
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
    return false;
  }

  Factory factory_ = [] { return std::make_unique<SdkBackend>(Environment::process()); };
  std::unique_ptr<SdkBackend> backend_;
  ConformanceReport report_;
  bool write_report_ = false;
  PeerChannel* peer_ = nullptr;
};

// What the checks of every group share. Each check takes the kit and a
// verdict, and names devices by the backend's logical indices (the SDK maps
// them to physical ones).
template <class R>
struct CheckTools {
  using Kit = Conformance<R>;
  using Obs = Observed<R>;

  // memcpy_async's last argument (host_pinned), named: whether the host
  // side of a copy is pinned memory, or there is no host side.
  static constexpr bool pageable = false;
  static constexpr bool pinned = true;
  static constexpr bool no_host_side = false;

  static bool no_device(Kit& kit, Verdict& v) {
    if (kit.devices() > 0) return false;
    v.skip(fmt::format("no device: {}", kit.backend().init_error().empty()
                                            ? std::string("the runtime reports 0 devices")
                                            : kit.backend().init_error()));
    return true;
  }
  static std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
    std::vector<unsigned char> p(n);
    std::mt19937 rng(seed);
    for (auto& c : p) c = static_cast<unsigned char>(rng());
    return p;
  }
  // `bytes` of device 0's memory at `p`, copied to the host.
  static std::vector<unsigned char> read(Kit& kit, const void* p, std::size_t bytes) {
    std::vector<unsigned char> h(bytes);
    kit.backend().memcpy(0, h.data(), p, bytes, CopyKind::device_to_host);
    return h;
  }
  // Queued work long enough to still run when the host asks about it:
  // copies through a 64 MiB buffer, `rounds` times, on `s`.
  struct Busy {
    void* a = nullptr;
    void* b = nullptr;
    std::size_t bytes = std::size_t{64} << 20;
  };
  static Busy make_busy(Kit& kit, device_index d) {
    Busy w;
    auto& b = kit.backend();
    w.bytes = std::min<std::size_t>(w.bytes, b.properties(d).max_allocation / 4);
    w.a = b.raw_malloc(d, w.bytes);
    w.b = b.raw_malloc(d, w.bytes);
    return w;
  }
  static void queue_busy(Kit& kit, device_index d, const Busy& w, StreamHandle s, int rounds) {
    for (int i = 0; i < rounds; ++i)
      kit.backend().memcpy_async(d, i % 2 ? w.a : w.b, i % 2 ? w.b : w.a, w.bytes,
                                 CopyKind::device_to_device, s, no_host_side);
  }
  static void free_busy(Kit& kit, device_index d, const Busy& w) {
    kit.backend().raw_free(d, w.a, w.bytes);
    kit.backend().raw_free(d, w.b, w.bytes);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE
