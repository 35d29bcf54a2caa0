// accelkit: the conformance kit's discovery checks: device_count,
// properties, <NAME>_VISIBLE_DEVICES and fork, what a runtime does before it
// has a device context (and must not make one for). Included by
// testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

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

template <class R>
struct DiscoveryChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using Tools::no_device;
  using Tools::pattern;

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
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_DISCOVERY_CHECKS(X)                                            \
  X(discovery, fork_after_discovery,                                                        \
    "a child forked after discovery uses the device, or is refused it with an error when "  \
    "fork_safe_discovery is false")                                                         \
  X(discovery, visible_devices_select,                                                      \
    "<NAME>_VISIBLE_DEVICES selects and orders the physical devices it names; the runtime " \
    "numbers every physical device and leaves the variable to the SDK")                     \
  X(discovery, device_count_stable,                                                         \
    "device_count fails only with DriverError, and the SDK's count is stable")              \
  X(discovery, discovery_starts_no_context,                                                 \
    "discovery through the SDK calls no member that makes a context (set_device, malloc, "  \
    "streams, events, copies, initialize)")
