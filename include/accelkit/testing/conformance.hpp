// accelkit: the conformance kit (C++): the contract's semantics, checked on
// any runtime, at the runtime level and through the SDK.
//
//   #include <accelkit/testing/conformance.hpp>
//   ACCELKIT_CONFORMANCE_SUITE(acme::AcmeRuntime)
//
// in one translation unit of a Catch2 test program (v2 or v3, linked with
// Catch2's main) registers every check as a test case named
// "conformance/<group>/<check>" and tagged [conformance][<group>]: Catch2's
// tag expressions select or skip groups ("[memory]", "~[threads]"), and so
// does ACCELKIT_CONFORMANCE_SKIP=group,group. The runtime is constructed
// with no arguments; ACCELKIT_CONFORMANCE_SUITE_WITH(R, expr) takes an
// expression that makes one (a prvalue R). Each check records a result in
// the report (Note [Conformance report]) written when the program ends to
// $ACCELKIT_CONFORMANCE_REPORT (default accelkit_conformance_<name>.json);
// a failing check also fails its Catch2 test case with the broken rule. A
// report path that cannot be written stops the program before the first
// check (exit 2), and a write that fails at the end makes it exit 1, each
// naming the file and the reason.
//
// Note [What the kit checks]
// Semantics, not signatures (the compiler checks those): what a real driver
// gets wrong silently. Every check runs on each device the runtime reports
// (physical ordinals; <NAME>_VISIBLE_DEVICES applies as for the SDK), with
// the runtime wrapped so that the calls it receives are counted and a free
// of memory that queued work still uses is caught (Note [Observing a
// runtime]). A runtime with no device (no driver, no hardware) passes every
// check as skipped, "no device", and the discovery checks still run. The
// fork check runs first, before anything else of the runtime has started,
// so the kit keeps Catch2's declaration order (do not pass --order rand).
#pragma once

#include <accelkit/accelkit.hpp>
#include <accelkit/testing/observed.hpp>
#include <accelkit/testing/report.hpp>

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <fmt/format.h>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

// Whether R offers the kit's fault hook: `void inject_fault(const
// std::string& member, int nth, bool async)` makes the nth call of `member`
// from now on fail (with `async`: its queued work fails later). Not part of
// the contract: a test hook, as simdev's, that the errors group needs.
template <class R, class = void>
inline constexpr bool has_fault_hook = false;
template <class R>
inline constexpr bool has_fault_hook<
    R, std::void_t<decltype(std::declval<R&>().inject_fault(std::declval<const std::string&>(), 1,
                                                            true))>> = true;

// Whether R offers the kit's context hook: `int contexts_created()`, how
// many device contexts the runtime (its driver) has made so far. Not part of
// the contract: a test hook, as simdev's, with which the kit sees a context
// that the runtime makes inside its own members (a device_count that opens
// the device), which counting the calls the SDK makes cannot see.
template <class R, class = void>
inline constexpr bool has_context_hook = false;
template <class R>
inline constexpr bool has_context_hook<
    R, std::void_t<decltype(static_cast<int>(std::declval<R&>().contexts_created()))>> = true;

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
};

// The checks. Each takes the kit and a verdict; physical device ordinals
// through the backend's logical ones (the SDK maps them).
template <class R>
struct Checks {
  using Kit = Conformance<R>;
  using Obs = Observed<R>;

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
                                 CopyKind::device_to_device, s, false);
  }
  static void free_busy(Kit& kit, device_index d, const Busy& w) {
    kit.backend().raw_free(d, w.a, w.bytes);
    kit.backend().raw_free(d, w.b, w.bytes);
  }

  // ------------------------------------------------------------- discovery
  static void fork_after_discovery(Kit& kit, Verdict& v) {
    auto b = kit.fresh_backend();
    int n = b->device_count();
    if (n == 0) return v.skip("no device");
    // The runtime's own properties: the SDK's initialize the backend.
    for (int d : b->visible_devices()) (void)b->runtime().properties(d);
    constexpr bool safe = ::accelkit::detail::constant_fork_safe_discovery<R>;
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return v.skip("pipe() failed");
    pid_t child = ::fork();
    if (child < 0) return v.skip("fork() failed");
    if (child == 0) {
      ::close(pipe_fds[0]);
      auto tell = [&](const char* what) {
        ssize_t ignored = ::write(pipe_fds[1], what, std::strlen(what));
        (void)ignored;
      };
      // The child: the device must work (fork-safe discovery), or be
      // refused with an error (not hang, not crash).
      int code = 0;
      try {
        std::vector<unsigned char> in = pattern(4096, 1), out(4096);
        void* p = b->raw_malloc(0, in.size());
        b->memcpy(0, p, in.data(), in.size(), CopyKind::host_to_device);
        b->memcpy(0, out.data(), p, out.size(), CopyKind::device_to_host);
        b->raw_free(0, p, in.size());
        code = in == out ? 10 : 11;
      } catch (const Error& e) {
        tell(e.what());
        code = 12;
      } catch (...) {
        code = 13;
      }
      std::_Exit(code);
    }
    ::close(pipe_fds[1]);
    int status = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (::waitpid(child, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        v.require(false, "a child forked after discovery hung using the device (30 s)");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    std::string said;
    char buf[512];
    for (ssize_t k; (k = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<std::size_t>(k));
    ::close(pipe_fds[0]);
    if (!said.empty()) said = ": " + said;
    if (safe)
      v.require(code == 10, fmt::format("fork_safe_discovery is true, but a child forked after "
                                        "device_count() and properties() could not use device "
                                        "0 (exit {}: 11 wrong data, 12 an error, 13 another "
                                        "exception, negative a signal){}",
                                        code, said));
    else
      v.require(code == 12, fmt::format("fork_safe_discovery is false, so a child forked after "
                                        "discovery must be refused device use with an error; it "
                                        "exited {} (10 used the device, negative a signal)",
                                        code));
  }
  // Sets (or, with nullptr, unsets) a process environment variable for a
  // scope; the old value comes back after it.
  class ScopedVariable {
   public:
    ScopedVariable(std::string name, const char* value) : name_(std::move(name)) {
      if (const char* old = std::getenv(name_.c_str())) old_ = old;
      if (value) ::setenv(name_.c_str(), value, 1);
      else ::unsetenv(name_.c_str());
    }
    ~ScopedVariable() {
      if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
      else ::unsetenv(name_.c_str());
    }
    ScopedVariable(const ScopedVariable&) = delete;
    ScopedVariable& operator=(const ScopedVariable&) = delete;

   private:
    std::string name_;
    std::optional<std::string> old_;
  };

  // <NAME>_VISIBLE_DEVICES is the SDK's to apply (Note [Visible devices]):
  // the runtime numbers every physical device whatever the variable says, so
  // that the SDK's logical device i is the physical device the variable
  // names i-th. A runtime (or its driver) that filters by the variable too
  // applies it twice. The variable is set in the process's environment, where
  // a driver would read it, before each fresh runtime is made.
  static void visible_devices_select(Kit& kit, Verdict& v) {
    const std::string var = visible_devices_variable(R::name);
    std::vector<std::string> uuids;
    {
      ScopedVariable unset(var, nullptr);
      auto b = kit.fresh_backend();
      for (int d = 0; d < b->device_count(); ++d) uuids.push_back(b->properties(d).uuid);
    }
    if (uuids.empty()) return v.skip("no device");
    auto selects = [&](const std::string& value, const std::vector<int>& physical) {
      ScopedVariable set(var, value.c_str());
      auto b = kit.fresh_backend();
      int seen = b->device_count();
      if (!v.require(seen == static_cast<int>(physical.size()),
                     fmt::format("with {}='{}' the SDK saw {} device(s), not {}: the runtime must "
                                 "number every physical device and leave the variable to the SDK",
                                 var, value, seen, physical.size())))
        return false;
      for (std::size_t i = 0; i < physical.size(); ++i) {
        int d = static_cast<int>(i);
        std::string uuid = b->properties(d).uuid;
        if (!v.require(uuid == uuids[static_cast<std::size_t>(physical[i])],
                       fmt::format("with {}='{}' logical device {} has UUID {}, not physical "
                                   "device {}'s {}",
                                   var, value, i, uuid, physical[i],
                                   uuids[static_cast<std::size_t>(physical[i])])))
          return false;
      }
      if (physical.empty()) return true;
      std::vector<unsigned char> in = pattern(4096, 7), out(in.size());
      void* p = b->raw_malloc(0, in.size());
      b->memcpy(0, p, in.data(), in.size(), CopyKind::host_to_device);
      b->memcpy(0, out.data(), p, out.size(), CopyKind::device_to_host);
      b->raw_free(0, p, in.size());
      return v.require(in == out, fmt::format("with {}='{}' a copy through logical device 0 "
                                              "came back different",
                                              var, value));
    };
    int n = static_cast<int>(uuids.size());
    for (int d = 0; d < std::min(n, 4); ++d)
      if (!selects(std::to_string(d), {d})) return;
    if (n >= 2 && !selects("1,0", {1, 0})) return;
    selects("", {});
  }
  static void device_count_stable(Kit& kit, Verdict& v) {
    auto b = kit.fresh_backend();
    // The runtime may fail only with DriverError (the SDK then reports 0
    // devices and keeps the reason); through the SDK it never throws.
    int first = -1;
    try {
      first = b->runtime().device_count();
    } catch (const DriverError&) {
      first = 0;
    } catch (const std::exception& e) {
      v.require(false, fmt::format("device_count() threw something other than DriverError: {}",
                                   e.what()));
      return;
    }
    v.require(first >= 0, fmt::format("device_count() returned {}", first));
    int seen = b->device_count();
    for (int i = 0; i < 3; ++i) {
      int again = b->device_count();
      if (!v.require(again == seen, fmt::format("device_count() gave {} then {}", seen, again)))
        return;
    }
  }
  static void discovery_starts_no_context(Kit& kit, Verdict& v) {
    auto b = kit.fresh_backend();
    for (int d : b->visible_devices()) (void)b->runtime().properties(d);
    CallCounts c = b->runtime().calls();
    for (Member m : {Member::set_device, Member::malloc, Member::host_malloc, Member::stream_create,
                     Member::event_create, Member::memcpy, Member::initialize}) {
      if (!v.require(c[m] == 0, fmt::format("discovery (device_count, properties) called {} {} "
                                            "time(s): it must not create a device context",
                                            member_names[static_cast<std::size_t>(m)], c[m])))
        return;
    }
    if constexpr (has_context_hook<R>) {
      int made = b->runtime().inner().contexts_created();
      v.require(made == 0, fmt::format("discovery (device_count, properties) made {} device "
                                       "context(s) inside the runtime (its context hook, "
                                       "contexts_created()): it must not create one",
                                       made));
    }
  }

  // ------------------------------------------------------------ properties
  static void properties_valid(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    for (int d = 0; d < kit.devices(); ++d) {
      // As the SDK reads them: a UUID the runtime leaves empty (unknown to
      // the driver) is derived (Note [Derived UUID]), not a broken rule.
      int phys = kit.backend().physical(d);
      DeviceProperties p = kit.runtime().properties(phys);
      fill_unknown(p, R::name, phys);
      std::vector<std::string> problems = property_problems(p, R::name);
      std::string all;
      for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
      if (!v.require(problems.empty(), fmt::format("device {}: {}", d, all))) return;
    }
  }
  static void max_allocation_allocates(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    std::size_t n = b.properties(0).max_allocation;
    if (n > (std::size_t{1} << 30) && !std::getenv("ACCELKIT_CONFORMANCE_LARGE"))
      return v.skip(fmt::format("max_allocation is {} bytes; set ACCELKIT_CONFORMANCE_LARGE=1 to "
                                "allocate it",
                                n));
    void* p = b.runtime().malloc(b.physical(0), n);
    if (!v.require(p != nullptr, fmt::format("malloc of max_allocation ({} bytes) returned nullptr "
                                             "on an idle device",
                                             n)))
      return;
    b.runtime().free(b.physical(0), p);
  }
  // A test allocation of device d, freed when it goes out of scope, so that
  // a member throwing in the middle of a check (host_map, a copy) leaves
  // nothing behind; free() frees it on the way that may report.
  template <class B>
  struct TestAllocation {
    B& b;
    int d;
    std::size_t n;
    unsigned char* p = static_cast<unsigned char*>(b.raw_malloc(d, n));
    TestAllocation(B& backend, int device, std::size_t bytes) : b(backend), d(device), n(bytes) {}
    TestAllocation(const TestAllocation&) = delete;
    TestAllocation& operator=(const TestAllocation&) = delete;
    ~TestAllocation() {
      if (p == nullptr) return;
      try {
        b.raw_free(d, p, n);
      } catch (...) {  // an exception is already on its way out of the check
      }
    }
    void free() {
      unsigned char* q = std::exchange(p, nullptr);
      if (q != nullptr) b.raw_free(d, q, n);
    }
  };
  static void host_visible_memory_is_visible(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    bool checked = false;
    for (int d = 0; d < kit.devices(); ++d) {
      if (!b.properties(d).host_visible_memory) continue;
      checked = true;
      std::vector<unsigned char> in = pattern(8192, 2), out(8192);
      TestAllocation<std::remove_reference_t<decltype(b)>> a(b, d, in.size());
      unsigned char* p = a.p;
      if (!v.require(p != nullptr, fmt::format("device {}: malloc of {} bytes failed", d, in.size())))
        return;
      b.memcpy(d, p, in.data(), in.size(), CopyKind::host_to_device);
      bool read = std::memcmp(p, in.data(), in.size()) == 0;
      for (std::size_t i = 0; i < in.size(); ++i) p[i] = static_cast<unsigned char>(in[i] ^ 0x5a);
      b.memcpy(d, out.data(), p, out.size(), CopyKind::device_to_host);
      a.free();
      if (!v.require(read, fmt::format("device {} reports host_visible_memory, but the host read "
                                       "other bytes than a copy wrote",
                                       d)))
        return;
      for (std::size_t i = 0; i < in.size(); ++i)
        if (!v.require(out[i] == static_cast<unsigned char>(in[i] ^ 0x5a),
                       fmt::format("device {} reports host_visible_memory, but a copy did not "
                                   "see what the host wrote (byte {})",
                                   d, i)))
          return;
    }
    if (!checked) v.skip("no device reports host_visible_memory: nothing to check");
  }
  // host_access mapped: the host reads and writes a range between host_map
  // and host_unmap (a whole allocation, and a part of one at an offset, as
  // the SDK maps a tensor's storage inside a pooled block), and a copy sees
  // what it wrote after the unmap.
  static void host_mapped_memory_is_visible(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    bool checked = false;
    for (int d = 0; d < kit.devices(); ++d) {
      if (b.properties(d).host_access != HostAccessLevel::mapped) continue;
      checked = true;
      constexpr std::size_t n = 3 * 4096;
      std::vector<unsigned char> in = pattern(n, 3), out(n);
      TestAllocation<std::remove_reference_t<decltype(b)>> a(b, d, n);
      unsigned char* p = a.p;
      if (!v.require(p != nullptr, fmt::format("device {}: malloc of {} bytes failed", d, n)))
        return;
      struct Range {
        std::size_t at, bytes;
      };
      bool ok = true;
      for (Range r : {Range{0, n}, Range{4096 + 128, 1000}}) {
        b.memcpy(d, p, in.data(), n, CopyKind::host_to_device);
        b.host_map(d, p + r.at, r.bytes);
        bool read = std::memcmp(p + r.at, in.data() + r.at, r.bytes) == 0;
        for (std::size_t i = r.at; i < r.at + r.bytes; ++i)
          p[i] = static_cast<unsigned char>(in[i] ^ 0x5a);
        b.host_unmap(d, p + r.at, r.bytes);
        b.memcpy(d, out.data(), p, n, CopyKind::device_to_host);
        ok = v.require(read, fmt::format("device {} reports host_access mapped, but the host "
                                         "read other bytes than a copy wrote between host_map "
                                         "and host_unmap of {} bytes at offset {}",
                                         d, r.bytes, r.at));
        for (std::size_t i = 0; ok && i < n; ++i) {
          bool inside = i >= r.at && i < r.at + r.bytes;
          auto want = static_cast<unsigned char>(inside ? in[i] ^ 0x5a : in[i]);
          ok = v.require(out[i] == want,
                         fmt::format("device {} reports host_access mapped, but after "
                                     "host_unmap a copy did not see what the host wrote (byte "
                                     "{}, mapped {} bytes at offset {})",
                                     d, i, r.bytes, r.at));
        }
        if (!ok) break;
      }
      a.free();
      if (!ok) return;
    }
    if (!checked) v.skip("no device reports host_access mapped: nothing to check");
  }
  static void event_timing_matches(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    EventHandle e1 = b.event_create(0, EventFlags::timing), e2 = b.event_create(0, EventFlags::timing);
    b.event_record(0, e1, s);
    Busy w = make_busy(kit, 0);
    queue_busy(kit, 0, w, s, 2);
    b.event_record(0, e2, s);
    b.stream_synchronize(0, s);
    if (b.properties(0).event_timing) {
      float ms = b.event_elapsed_time(0, e1, e2);
      v.require(ms >= 0 && ms < 600000,
                fmt::format("event_timing is reported, and two records around 128 MiB of "
                            "copies are {} ms apart",
                            ms));
    } else {
      bool refused = false;
      try {
        (void)b.event_elapsed_time(0, e1, e2);
      } catch (const NotSupportedError&) {
        refused = true;
      }
      v.require(refused, "event_timing is false, yet elapsed_time did not refuse");
    }
    free_busy(kit, 0, w);
    b.event_destroy(0, e1);
    b.event_destroy(0, e2);
    b.stream_destroy(0, s);
  }

  // ---------------------------------------------------------------- memory
  static void malloc_aligned(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    for (int d = 0; d < kit.devices(); ++d) {
      std::size_t align = b.properties(d).memory_alignment;
      std::vector<std::pair<void*, std::size_t>> held;
      for (std::size_t n : {1, 7, 128, 255, 256, 4097, 65536 + 3, 1 << 20}) {
        void* p = b.runtime().malloc(b.physical(d), n);
        if (!v.require(p != nullptr, fmt::format("malloc({}, {}) returned nullptr", d, n))) break;
        held.emplace_back(p, n);
        v.require(reinterpret_cast<std::uintptr_t>(p) % align == 0,
                  fmt::format("malloc({}, {}) returned {}, not aligned to memory_alignment {}", d, n,
                              p, align));
      }
      for (auto [p, n] : held) b.runtime().free(b.physical(d), p);
      if (v.status() != CheckStatus::pass) return;
    }
  }
  static void exhaustion_is_nullptr(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    const DeviceProperties& p = b.properties(0);
    if (p.total_memory > (std::size_t{4} << 30) && !std::getenv("ACCELKIT_CONFORMANCE_LARGE"))
      return v.skip(fmt::format("total_memory is {} bytes; set ACCELKIT_CONFORMANCE_LARGE=1 to "
                                "exhaust it",
                                p.total_memory));
    std::size_t chunk = std::max<std::size_t>(p.max_allocation / 2, 1 << 20);
    std::vector<void*> held;
    void* last = nullptr;
    for (std::size_t i = 0; i < 4 * (p.total_memory / chunk + 2); ++i) {
      last = b.runtime().malloc(b.physical(0), chunk);
      if (!last) break;
      held.push_back(last);
    }
    v.require(last == nullptr, fmt::format("malloc never returned nullptr after {} bytes ({} "
                                           "bytes of capacity)",
                                           held.size() * chunk, p.total_memory));
    for (void* q : held) b.runtime().free(b.physical(0), q);
    void* again = b.runtime().malloc(b.physical(0), chunk);
    v.require(again != nullptr, "after exhaustion and freeing everything, malloc still failed");
    if (again) b.runtime().free(b.physical(0), again);
  }

  // ---------------------------------------------------------------- copies
  static void copies_every_direction(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    for (int d = 0; d < kit.devices(); ++d) {
      for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{512}, std::size_t{4099},
                            (std::size_t{1} << 20) + 7}) {
        std::vector<unsigned char> in = pattern(n, static_cast<unsigned>(n)), out(n, 0);
        void* a = b.raw_malloc(d, n);
        void* c = b.raw_malloc(d, n);
        b.memcpy(d, a, in.data(), n, CopyKind::host_to_device);
        b.memcpy(d, c, a, n, CopyKind::device_to_device);
        b.memcpy(d, out.data(), c, n, CopyKind::device_to_host);
        b.raw_free(d, a, n);
        b.raw_free(d, c, n);
        std::size_t bad = static_cast<std::size_t>(
            std::mismatch(in.begin(), in.end(), out.begin()).first - in.begin());
        if (!v.require(bad == n, fmt::format("device {}: {} bytes host->device->device->host "
                                             "came back different from byte {}",
                                             d, n, bad)))
          return;
      }
    }
  }
  static void async_copies_ordered(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    std::size_t n = (std::size_t{4} << 20) + 5;
    StreamHandle s = b.stream_create(0, 0);
    auto* host_in = static_cast<unsigned char*>(b.raw_host_malloc(0, n));
    auto* host_out = static_cast<unsigned char*>(b.raw_host_malloc(0, n));
    std::vector<unsigned char> in = pattern(n, 3);
    std::memcpy(host_in, in.data(), n);
    std::memset(host_out, 0, n);
    void* a = b.raw_malloc(0, n);
    void* c = b.raw_malloc(0, n);
    b.memcpy_async(0, a, host_in, n, CopyKind::host_to_device, s, true);
    b.memcpy_async(0, c, a, n, CopyKind::device_to_device, s, false);
    b.memset_async(0, static_cast<char*>(c) + 100, 0x7e, 1000, s);
    b.memset_async(0, a, 0, n, s);  // after the copy out of a: must not reach c
    b.memcpy_async(0, host_out, c, n, CopyKind::device_to_host, s, true);
    b.stream_synchronize(0, s);
    std::vector<unsigned char> want = in;
    std::memset(want.data() + 100, 0x7e, 1000);
    std::size_t bad =
        static_cast<std::size_t>(std::mismatch(want.begin(), want.end(), host_out).first - want.begin());
    v.require(bad == n, fmt::format("copies and fills queued on one stream ran out of order or "
                                    "wrong: byte {} of {} differs",
                                    bad, n));
    b.raw_free(0, a, n);
    b.raw_free(0, c, n);
    b.raw_host_free(0, host_in);
    b.raw_host_free(0, host_out);
    b.stream_destroy(0, s);
  }

  // --------------------------------------------------------------- streams
  static void stream_query_never_blocks(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    v.require(b.stream_query(0, s), "a new stream is not idle (stream_query false)");
    Busy w = make_busy(kit, 0);
    auto t0 = std::chrono::steady_clock::now();
    queue_busy(kit, 0, w, s, 16);
    auto t1 = std::chrono::steady_clock::now();
    bool idle = b.stream_query(0, s);
    auto t2 = std::chrono::steady_clock::now();
    b.stream_synchronize(0, s);
    auto t3 = std::chrono::steady_clock::now();
    double query = std::chrono::duration<double>(t2 - t1).count();
    double work = std::chrono::duration<double>(t3 - t0).count();
    if (!idle)
      v.require(query < 0.5 * work + 0.001,
                fmt::format("stream_query took {:.1f} ms with {:.1f} ms of work queued: it must "
                            "not wait for the work",
                            query * 1e3, work * 1e3));
    else
      v.require(query < 0.5 * work || work < 0.002,
                fmt::format("stream_query returned true after {:.1f} ms, with {:.1f} ms of work "
                            "queued: it waited for the work",
                            query * 1e3, work * 1e3));
    v.require(b.stream_query(0, s), "stream_query is false after stream_synchronize");
    free_busy(kit, 0, w);
    b.stream_destroy(0, s);
  }
  // An event recorded behind a stream's last work completes no earlier than
  // that work, so once it is complete the stream is idle (CUDA: an event's
  // completion means the work before it is done). A runtime that signals the
  // event before it counts the work done answers "busy" in between.
  static void stream_idle_after_event(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    EventHandle e = b.event_create(0, EventFlags::none);
    constexpr std::size_t n = 4096;
    void* a = b.raw_malloc(0, n);
    constexpr int kRounds = 1000;
    int busy = 0;
    for (int i = 0; i < kRounds; ++i) {
      b.memset_async(0, a, i & 0xff, n, s);
      b.event_record(0, e, s);
      b.event_synchronize(0, e);
      if (!b.stream_query(0, s)) ++busy;
    }
    b.stream_synchronize(0, s);
    v.require(busy == 0,
              fmt::format("stream_query was false right after event_synchronize returned for an "
                          "event recorded behind the stream's last work, {} times in {}: the "
                          "stream must be idle once that event is complete",
                          busy, kRounds));
    b.raw_free(0, a, n);
    b.event_destroy(0, e);
    b.stream_destroy(0, s);
  }
  static void cross_stream_wait(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s1 = b.stream_create(0, 0), s2 = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    std::size_t n = 1 << 20;
    std::vector<unsigned char> out(n, 0);
    queue_busy(kit, 0, w, s1, 8);
    b.memset_async(0, w.b, 0x3c, n, s1);  // the last work before the event
    EventHandle e = b.event_create(0, EventFlags::none);
    b.event_record(0, e, s1);
    b.stream_wait_event(0, s2, e);
    void* c = b.raw_malloc(0, n);
    b.memcpy_async(0, c, w.b, n, CopyKind::device_to_device, s2, false);
    b.stream_synchronize(0, s2);
    b.memcpy(0, out.data(), c, n, CopyKind::device_to_host);
    std::size_t bad = static_cast<std::size_t>(
        std::find_if(out.begin(), out.end(), [](unsigned char x) { return x != 0x3c; }) -
        out.begin());
    v.require(bad == n, fmt::format("work queued on a stream after stream_wait_event ran before "
                                    "the event's work on another stream completed (byte {} of "
                                    "{} not yet written)",
                                    bad, n));
    b.stream_synchronize(0, s1);
    b.raw_free(0, c, n);
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    b.stream_destroy(0, s1);
    b.stream_destroy(0, s2);
  }
  // Note [Host signals]: work queued after a stream's wait for a signal runs
  // only once the host completes it; a failed signal is the stream's error,
  // once; a signal a stream waits for is not destroyed before completion.
  static void signal_wait_orders(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    if constexpr (!Kit::SdkBackend::has_stream_signals) {
      v.skip("the runtime has no host signal members (signal_create, stream_wait_signal, "
             "signal_complete, signal_destroy): the SDK waits for its own signals on the host");
    } else {
      auto& b = kit.backend();
      StreamHandle s = b.stream_create(0, 0);
      std::size_t n = 4096;
      std::vector<unsigned char> out(n, 0);
      void* a = b.raw_malloc(0, n);
      b.memset_async(0, a, 0x11, n, s);
      SignalHandle g = b.signal_create(0);
      b.stream_wait_signal(0, s, g);
      b.memset_async(0, a, 0x22, n, s);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bool held = !b.stream_query(0, s);
      bool refused = false;
      try {
        b.signal_destroy(0, g);
      } catch (const DriverError&) {
        refused = true;
      }
      b.signal_complete(0, g, 0);
      b.stream_synchronize(0, s);
      b.memcpy(0, out.data(), a, n, CopyKind::device_to_host);
      if (!refused) v.require(false, "signal_destroy of a signal a stream waits for, not "
                                     "completed, did not throw DriverError");
      else b.signal_destroy(0, g);
      v.require(held, "a stream waiting for a signal not completed was idle after 20 ms: the "
                      "work queued after the wait ran");
      v.require(out[0] == 0x22 && out[n - 1] == 0x22,
                "the work queued after stream_wait_signal did not run once the signal was "
                "completed");
      SignalHandle f = b.signal_create(0);
      b.stream_wait_signal(0, s, f);
      // The runtime's own report, once (through the Backend the SDK keeps
      // a failure itself while the signal lives: Note [Failed waits]).
      b.runtime().signal_complete(b.physical(0), f, 5);
      bool failed = false;
      try {
        b.runtime().stream_synchronize(b.physical(0), s);
      } catch (const DriverError&) {
        failed = true;
      }
      v.require(failed, "a stream that waited for a signal completed with an error did not "
                        "report an asynchronous error at stream_synchronize");
      b.runtime().stream_synchronize(b.physical(0), s);  // once
      b.signal_destroy(0, f);
      b.raw_free(0, a, n);
      b.stream_destroy(0, s);
    }
  }
  static void priorities_in_range(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamPriorityRange r = b.properties(0).stream_priorities;
    int lo = std::min(r.lowest, r.highest), hi = std::max(r.lowest, r.highest);
    for (int p = lo; p <= hi; ++p) {
      StreamHandle s = b.runtime().stream_create(b.physical(0), p);
      std::vector<unsigned char> in = pattern(4096, 5), out(4096);
      void* a = b.raw_malloc(0, in.size());
      b.runtime().memcpy_async(b.physical(0), a, in.data(), in.size(), CopyKind::host_to_device, s,
                               false);
      b.runtime().memcpy_async(b.physical(0), out.data(), a, out.size(), CopyKind::device_to_host,
                               s, false);
      b.runtime().stream_synchronize(b.physical(0), s);
      b.runtime().stream_destroy(b.physical(0), s);
      b.raw_free(0, a, in.size());
      if (!v.require(in == out, fmt::format("a stream of priority {} (range {}..{}) copied wrong",
                                            p, r.lowest, r.highest)))
        return;
    }
  }

  // ---------------------------------------------------------------- events
  static void event_query_before_record(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    EventHandle e = b.runtime().event_create(b.physical(0), EventFlags::none);
    v.require(b.runtime().event_query(b.physical(0), e), "an event never recorded queries false");
    b.runtime().event_synchronize(b.physical(0), e);  // must return at once
    b.runtime().event_destroy(b.physical(0), e);
  }
  static void event_rerecord_replaces(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle busy = b.stream_create(0, 0), idle = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    EventHandle e = b.event_create(0, EventFlags::none);
    auto t0 = std::chrono::steady_clock::now();
    queue_busy(kit, 0, w, busy, 16);
    b.event_record(0, e, busy);
    b.event_record(0, e, idle);  // replaces: captures the idle stream
    auto t1 = std::chrono::steady_clock::now();
    b.event_synchronize(0, e);
    auto t2 = std::chrono::steady_clock::now();
    b.stream_synchronize(0, busy);
    auto t3 = std::chrono::steady_clock::now();
    double waited = std::chrono::duration<double>(t2 - t1).count();
    double work = std::chrono::duration<double>(t3 - t0).count();
    if (work < 0.005)
      v.skip(fmt::format("1 GiB of copies took {:.1f} ms: too fast to tell", work * 1e3));
    v.require(waited < 0.5 * work,
              fmt::format("after an event was recorded again on an idle stream, "
                          "event_synchronize waited {:.1f} ms, as long as the {:.1f} ms of work "
                          "its earlier record captured",
                          waited * 1e3, work * 1e3));
    v.require(b.event_query(0, e), "an event queries false after both streams it was recorded on "
                                   "are idle");
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    b.stream_destroy(0, busy);
    b.stream_destroy(0, idle);
  }

  // A wait made on an event's record stays on that record: recording the
  // event again (here on an idle stream) must not release it. A driver that
  // resolves waits late, against whatever the event holds when the waiting
  // stream next runs, breaks this.
  static void rerecord_keeps_earlier_waits(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s1 = b.stream_create(0, 0), s2 = b.stream_create(0, 0),
                 s3 = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    std::size_t n = 1 << 20;
    std::vector<unsigned char> out(n, 0);
    queue_busy(kit, 0, w, s1, 8);
    b.memset_async(0, w.b, 0x5a, n, s1);  // the last work before the first record
    EventHandle e = b.event_create(0, EventFlags::none);
    b.event_record(0, e, s1);
    b.stream_wait_event(0, s2, e);
    b.event_record(0, e, s3);  // again, on an idle stream: only later waits see it
    void* c = b.raw_malloc(0, n);
    b.memcpy_async(0, c, w.b, n, CopyKind::device_to_device, s2, false);
    b.stream_synchronize(0, s2);
    b.memcpy(0, out.data(), c, n, CopyKind::device_to_host);
    std::size_t bad = static_cast<std::size_t>(
        std::find_if(out.begin(), out.end(), [](unsigned char x) { return x != 0x5a; }) -
        out.begin());
    v.require(bad == n, fmt::format("a stream waiting on an event ran on when the event was "
                                    "recorded again on an idle stream, before the work of the "
                                    "record it waited on completed (byte {} of {} not yet "
                                    "written)",
                                    bad, n));
    b.stream_synchronize(0, s1);
    b.raw_free(0, c, n);
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    for (StreamHandle s : {s1, s2, s3}) b.stream_destroy(0, s);
  }

  // A stream of device 1 waits for an event recorded on device 0 (the
  // runtime's stream_wait_peer_event, or the SDK's wait on the host without
  // it: Note [Cross-device waits]): an event recorded behind the wait
  // completes only after the awaited event (asked of that event: simdev's
  // stream_query may still answer false for a moment after an event
  // recorded behind a stream's last work has completed).
  static void cross_device_wait(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    if (kit.devices() < 2) return v.skip("one device: no wait across devices to check");
    auto& b = kit.backend();
    StreamHandle s0 = b.stream_create(0, 0), s1 = b.stream_create(1, 0);
    Busy w = make_busy(kit, 0);
    queue_busy(kit, 0, w, s0, 8);
    EventHandle e = b.event_create(0, EventFlags::none), after = b.event_create(1, EventFlags::none);
    b.event_record(0, e, s0);  // the last work of s0
    b.stream_wait_peer_event(1, s1, 0, e);
    b.event_record(1, after, s1);
    b.event_synchronize(1, after);
    v.require(b.event_query(0, e),
              "an event recorded on a stream of device 1 behind a wait for an event of device 0 "
              "completed while the awaited work was still running");
    b.stream_synchronize(0, s0);
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    b.event_destroy(1, after);
    b.stream_destroy(0, s0);
    b.stream_destroy(1, s1);
  }

  // ---------------------------------------------------------------- device
  static void device_synchronize_covers_streams(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    Busy w = make_busy(kit, 0);
    std::vector<StreamHandle> streams;
    for (int i = 0; i < 3; ++i) {
      streams.push_back(b.stream_create(0, 0));
      queue_busy(kit, 0, w, streams.back(), 4);
    }
    b.device_synchronize(0);
    for (StreamHandle s : streams)
      v.require(b.stream_query(0, s), "a stream still has work after device_synchronize");
    for (StreamHandle s : streams) b.stream_destroy(0, s);
    free_busy(kit, 0, w);
  }

  // --------------------------------------------------------------- threads
  static void threads_copy_independently(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    std::atomic<int> wrong{0}, errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        try {
          b.set_device(0);
          StreamHandle s = b.stream_create(0, 0);
          std::size_t n = 65536 + static_cast<std::size_t>(t);
          auto* host = static_cast<unsigned char*>(b.raw_host_malloc(0, n));
          void* dev = b.raw_malloc(0, n);
          for (int i = 0; i < 50; ++i) {
            std::vector<unsigned char> in = pattern(n, static_cast<unsigned>(t * 100 + i));
            b.memcpy_async(0, dev, in.data(), n, CopyKind::host_to_device, s, false);
            b.memcpy_async(0, host, dev, n, CopyKind::device_to_host, s, true);
            b.stream_synchronize(0, s);
            if (std::memcmp(host, in.data(), n) != 0) ++wrong;
          }
          b.raw_free(0, dev, n);
          b.raw_host_free(0, host);
          b.stream_destroy(0, s);
        } catch (...) {
          ++errors;
        }
      });
    for (std::thread& t : threads) t.join();
    v.require(errors == 0, fmt::format("{} of 4 threads failed with an error", errors.load()));
    v.require(wrong == 0, fmt::format("{} of 200 round trips on 4 threads came back wrong",
                                      wrong.load()));
  }

  // ---------------------------------------------------------------- errors
  // Note [Asynchronous errors in the kit]: the contract lets a failure of
  // queued work surface at the next synchronize, query or stream-ordered
  // call on the device; the observer's marker records are such calls. So a
  // check counts the DriverErrors of the whole sequence: exactly one, and
  // then the device works again.
  template <class F>
  static int driver_errors(F&& f, std::string& what) {
    try {
      f();
      return 0;
    } catch (const DriverError& e) {
      what = e.what();
      return 1;
    }
  }
  static bool no_fault_hook(Verdict& v) {
    if constexpr (has_fault_hook<R>) {
      (void)v;
      return false;
    } else {
      v.skip("the runtime offers no fault hook (inject_fault(member, nth, async)): asynchronous "
             "errors cannot be provoked");
      return true;
    }
  }
  template <class F>
  static void error_surfaces_once(Kit& kit, Verdict& v, const char* member, const char* where,
                                  F&& sequence) {
    if (no_fault_hook(v) || no_device(kit, v)) return;
    auto& b = kit.backend();
    if constexpr (has_fault_hook<R>) {
      StreamHandle s = b.stream_create(0, 0);
      std::size_t n = 1 << 20;
      void* a = b.raw_malloc(0, n);
      b.runtime().inner().inject_fault(member, 1, true);
      std::string what;
      int errors = sequence(b, s, a, n, what);
      v.require(errors == 1, fmt::format("a failure of queued {} surfaced {} time(s) {} (once is "
                                         "the rule)",
                                         member, errors, where));
      if (errors >= 1)
        v.require(what.find(std::string(R::name)) != std::string::npos,
                  fmt::format("the error does not name the backend: {}", what));
      // The device works again.
      std::vector<unsigned char> in = pattern(n, 9), out(n, 0);
      b.memcpy_async(0, a, in.data(), n, CopyKind::host_to_device, s, false);
      b.memcpy_async(0, out.data(), a, n, CopyKind::device_to_host, s, false);
      b.stream_synchronize(0, s);
      v.require(in == out, "after an asynchronous error, a copy came back wrong");
      b.raw_free(0, a, n);
      b.stream_destroy(0, s);
    }
  }
  static void error_at_synchronize(Kit& kit, Verdict& v) {
    error_surfaces_once(kit, v, "memset_async", "by the call, its stream's synchronize, and a second synchronize",
                        [](auto& b, StreamHandle s, void* a, std::size_t n, std::string& what) {
                          int e = driver_errors([&] { b.memset_async(0, a, 1, n, s); }, what);
                          e += driver_errors([&] { b.stream_synchronize(0, s); }, what);
                          e += driver_errors([&] { b.stream_synchronize(0, s); }, what);
                          return e;
                        });
  }
  static void error_at_query(Kit& kit, Verdict& v) {
    error_surfaces_once(kit, v, "memset_async", "while its stream was queried until idle",
                        [](auto& b, StreamHandle s, void* a, std::size_t n, std::string& what) {
                          int e = driver_errors([&] { b.memset_async(0, a, 2, n, s); }, what);
                          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                          bool idle = false;
                          while (!idle && std::chrono::steady_clock::now() < deadline)
                            e += driver_errors([&] { idle = b.stream_query(0, s); }, what);
                          e += driver_errors([&] { idle = b.stream_query(0, s); }, what);
                          return idle ? e : -1;
                        });
  }
  static void error_at_event(Kit& kit, Verdict& v) {
    error_surfaces_once(kit, v, "memcpy_async", "by the copy, an event recorded after it, the event's synchronize and its query",
                        [](auto& b, StreamHandle s, void* a, std::size_t n, std::string& what) {
                          EventHandle ev = b.event_create(0, EventFlags::none);
                          void* c = b.raw_malloc(0, n);
                          int e = driver_errors(
                              [&] { b.memcpy_async(0, c, a, n, CopyKind::device_to_device, s, false); },
                              what);
                          e += driver_errors([&] { b.event_record(0, ev, s); }, what);
                          e += driver_errors([&] { b.event_synchronize(0, ev); }, what);
                          e += driver_errors([&] { (void)b.event_query(0, ev); }, what);
                          e += driver_errors([&] { b.device_synchronize(0); }, what);
                          b.event_destroy(0, ev);
                          b.raw_free(0, c, n);
                          return e;
                        });
  }

  // ------------------------------------------- ordering, through the SDK
  static void no_free_under_queued_work(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    (void)b.runtime().take_violations();
    {
      DeviceCachingAllocator<Obs> pool(b, 0, AllocatorConfig{});
      StreamHandle s = b.stream_create(0, 0), other = b.stream_create(0, 0);
      Busy w = make_busy(kit, 0);
      for (int round = 0; round < 3; ++round) {
        std::size_t n = std::size_t{24} << 20;
        void* p = pool.allocate(n, s);
        queue_busy(kit, 0, w, s, 4);
        b.memset_async(0, p, round, n, s);
        pool.record_stream(p, other);
        b.memset_async(0, p, round + 1, n, other);
        pool.deallocate(p);
        pool.empty_cache();  // frees the segment once its work is done
      }
      b.device_synchronize(0);
      free_busy(kit, 0, w);
      b.stream_destroy(0, s);
      b.stream_destroy(0, other);
    }
    std::vector<std::string> bad = b.runtime().take_violations();
    v.require(bad.empty(), bad.empty() ? "" : bad.front());
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// One test case per check (group, check, the rule it proves).
#define ACCELKIT_CONFORMANCE_CHECKS(X)                                                           \
  X(discovery, fork_after_discovery,                                                             \
    "a child forked after discovery uses the device, or is refused it with an error when "       \
    "fork_safe_discovery is false")                                                              \
  X(discovery, visible_devices_select,                                                           \
    "<NAME>_VISIBLE_DEVICES selects and orders the physical devices it names; the runtime "     \
    "numbers every physical device and leaves the variable to the SDK")                          \
  X(discovery, device_count_stable,                                                              \
    "device_count fails only with DriverError, and the SDK's count is stable")       \
  X(discovery, discovery_starts_no_context,                                                      \
    "discovery through the SDK calls no member that makes a context (set_device, malloc, "       \
    "streams, events, copies, initialize)")                                                      \
  X(properties, properties_valid, "properties are complete and consistent (the schema's rules)") \
  X(properties, max_allocation_allocates, "max_allocation bytes can be allocated")              \
  X(properties, host_visible_memory_is_visible,                                                  \
    "host_visible_memory: the host reads and writes device memory directly")                    \
  X(properties, host_mapped_memory_is_visible,                                                   \
    "host_access mapped: the host reads and writes memory between host_map and host_unmap")     \
  X(properties, event_timing_matches,                                                            \
    "event_timing says whether elapsed_time works: it measures, or is refused")                 \
  X(memory, malloc_aligned, "malloc returns memory aligned to memory_alignment")                \
  X(memory, exhaustion_is_nullptr,                                                               \
    "malloc returns nullptr when memory runs out, and works again after frees")                 \
  X(copies, copies_every_direction, "copies in every direction and size are exact")             \
  X(copies, async_copies_ordered, "copies and fills queued on one stream run in order")         \
  X(streams, stream_query_never_blocks, "stream_query never waits for queued work")             \
  X(streams, stream_idle_after_event,                                                            \
    "stream_query is true once an event recorded behind the stream's last work is complete")    \
  X(streams, cross_stream_wait, "stream_wait_event orders later work after the event's work")   \
  X(streams, priorities_in_range, "every priority in the reported range makes a working stream") \
  X(streams, signal_wait_orders,                                                                 \
    "work queued after stream_wait_signal runs once the host completes the signal; a failed "    \
    "signal is the stream's error, once; a signal waited for is not destroyed before completion") \
  X(events, event_query_before_record, "an event never recorded is complete")                   \
  X(events, event_rerecord_replaces, "recording an event again replaces its last record")       \
  X(events, rerecord_keeps_earlier_waits,                                                         \
    "a wait on an event stays on the record it saw: recording the event again does not release "  \
    "it")                                                                                        \
  X(events, cross_device_wait,                                                                    \
    "a stream waits for an event of another device: later work runs after the event's work")    \
  X(device, device_synchronize_covers_streams, "device_synchronize waits for every stream")     \
  X(threads, threads_copy_independently, "streams, copies and pinned memory work from many threads") \
  X(errors, error_at_synchronize,                                                                \
    "a failure of queued work surfaces once, as a DriverError naming the backend, at the next "  \
    "synchronize or stream-ordered call; the device then works")                                \
  X(errors, error_at_query, "a failure of queued work surfaces once while its stream is queried") \
  X(errors, error_at_event,                                                                      \
    "a failure of queued work surfaces once through an event recorded after it")                \
  X(ordering, no_free_under_queued_work,                                                         \
    "no memory goes back to the driver while queued work still uses it")

// Runs check `check` of the kit for runtime R outside the suite (not in the
// report): for tests of the kit itself.
#define ACCELKIT_CONFORMANCE_EVALUATE(R, group_, check_)                                        \
  [] {                                                                                         \
    const char* rule_ = "";                                                                    \
    const char* check_name_ = #check_;                                                         \
    ACCELKIT_CONFORMANCE_CHECKS(ACCELKIT_DETAIL_CONFORMANCE_RULE_)                              \
    return ::accelkit::testing::Conformance<R>::instance().evaluate(                           \
        #group_, #check_, rule_, &::accelkit::testing::Checks<R>::check_);                     \
  }()
#define ACCELKIT_DETAIL_CONFORMANCE_RULE_(group, check, rule) \
  if (std::string_view(#check) == std::string_view(check_name_)) rule_ = rule;

#define ACCELKIT_DETAIL_CONFORMANCE_CASE_(group, check, rule)                                    \
  TEST_CASE("conformance/" #group "/" #check, "[conformance][" #group "]") {                     \
    using kit_ = ::accelkit::testing::Conformance<accelkit_conformance_runtime_>;                 \
    accelkit_conformance_setup_();                                                                \
    kit_::instance().run(#group, #check, rule,                                                    \
                         &::accelkit::testing::Checks<accelkit_conformance_runtime_>::check);    \
  }

// The whole suite for runtime R, made by R's default constructor.
#define ACCELKIT_CONFORMANCE_SUITE(R)                                 \
  namespace {                                                         \
  using accelkit_conformance_runtime_ = R;                            \
  void accelkit_conformance_setup_() {}                               \
  }                                                                   \
  ACCELKIT_CONFORMANCE_CHECKS(ACCELKIT_DETAIL_CONFORMANCE_CASE_)

// The whole suite for runtime R, made from the constructor arguments that
// follow (evaluated once per runtime the kit makes).
#define ACCELKIT_CONFORMANCE_SUITE_WITH(R, ...)                                                \
  namespace {                                                                                  \
  using accelkit_conformance_runtime_ = R;                                                     \
  void accelkit_conformance_setup_() {                                                         \
    using kit_ = ::accelkit::testing::Conformance<R>;                                          \
    static bool done = [] {                                                                    \
      kit_::instance().set_factory([] {                                                        \
        return std::make_unique<kit_::SdkBackend>(::accelkit::Environment::process(),          \
                                                  __VA_ARGS__);                                \
      });                                                                                      \
      return true;                                                                             \
    }();                                                                                       \
    (void)done;                                                                                \
  }                                                                                            \
  }                                                                                            \
  ACCELKIT_CONFORMANCE_CHECKS(ACCELKIT_DETAIL_CONFORMANCE_CASE_)
