// accelkit/support: a runtime's test-only fault hook, what the conformance
// kit's errors group calls (inject_fault(member, nth, async)) and what a
// <PREFIX>_INJECT_FAULT variable arms for the Python tests.
//
//   FaultHook faults{"acme", "ACME_INJECT_FAULT", {"memcpy_async", "memset_async"}};
//   faults.arm_from(env.get("ACME_INJECT_FAULT"));       // "memset_async@2:async,malloc"
//   void inject_fault(const std::string& m, int nth, bool async) { faults.arm(m, nth, async); }
//   // in a member:
//   if (auto f = faults.fire("memset_async"))
//     if (*f == FaultTiming::at_call) driver_error(...);   // else: mark the queued work failed
//
// Note [Fault hooks]
// Problem: the kit's errors group and the Python fault tests need a
// failure of a given call, or of the work it queues, on demand; a real
// driver fails when it likes, not when a test asks.
// Decision: the hook counts the calls of each armed member; the nth call
// from the arming fires, once. The runtime then fails that call as its
// driver would fail it (at_call), or lets it queue its work and reports
// that work as failed the way its driver reports a failure of queued work
// (in_queued_work: a status of an event, a lost device). Only the members
// named at construction queue work that can fail later; arming another one
// asynchronously is a ValueError naming it.
// Limits: a test hook: one pending fault per member; a member costs one
// atomic load per call while nothing is armed.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/strings.hpp>
#include <accelkit/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

enum class FaultTiming { at_call, in_queued_work };

class FaultHook {
 public:
  // `queuing`: the members whose queued work may be made to fail.
  FaultHook(std::string_view backend, std::string_view variable,
            std::initializer_list<std::string_view> queuing)
      : backend_(backend), variable_(variable), queuing_(queuing.begin(), queuing.end()) {}
  FaultHook(const FaultHook&) = delete;
  FaultHook& operator=(const FaultHook&) = delete;

  // The nth call of `member` from now on fails, once (Note [Fault hooks]).
  void arm(const std::string& member, int nth, bool async) {
    if (nth < 1)
      throw ValueError(backend_, fmt::format("inject_fault: nth must be at least 1, got {}", nth));
    if (async && std::find(queuing_.begin(), queuing_.end(), member) == queuing_.end())
      throw ValueError(backend_, fmt::format("inject_fault: {} queues no work, so it cannot fail "
                                             "asynchronously (these can: {})",
                                             member, fmt::join(queuing_, ", ")));
    std::lock_guard<std::mutex> lock(mutex_);
    armed_[member] = Armed{nth, async ? FaultTiming::in_queued_work : FaultTiming::at_call};
    any_.store(true, std::memory_order_release);
  }

  // Arms each entry of a comma list of member[@n][:async] (the variable's
  // value; nothing for none); a malformed list is a ValueError naming the
  // variable, and arms nothing.
  void arm_from(std::optional<std::string> list) {
    if (!list) return;
    struct Entry { std::string member; int nth; bool async; };
    std::vector<Entry> entries;
    for (std::string_view item : ::accelkit::detail::split_list(*list)) {
      Entry e{std::string(item), 1, false};
      auto bad = [&] {
        return ValueError(backend_, fmt::format("{}='{}': entry '{}' is not member[@n][:async]",
                                                variable_, *list, item));
      };
      if (auto colon = e.member.find(':'); colon != std::string::npos) {
        if (e.member.substr(colon + 1) != "async") throw bad();
        e.async = true;
        e.member.resize(colon);
      }
      if (auto at = e.member.find('@'); at != std::string::npos) {
        std::string n = e.member.substr(at + 1);
        if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
          throw bad();
        e.nth = std::stoi(n);
        e.member.resize(at);
      }
      if (e.member.empty() || e.nth < 1 || e.member.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) throw bad();
      entries.push_back(std::move(e));
    }
    for (const Entry& e : entries) arm(e.member, e.nth, e.async);
  }

  // Counts a call of `member`; when it is the armed one, disarms it and says
  // how it fails.
  std::optional<FaultTiming> fire(std::string_view member) {
    if (!any_.load(std::memory_order_acquire)) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = armed_.find(member);
    if (it == armed_.end() || --it->second.left > 0) return std::nullopt;
    FaultTiming when = it->second.when;
    armed_.erase(it);
    any_.store(!armed_.empty(), std::memory_order_release);
    return when;
  }

  // Disarms every member.
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_.clear();
    any_.store(false, std::memory_order_release);
  }

 private:
  struct Armed {
    int left;
    FaultTiming when;
  };
  std::string_view backend_, variable_;
  std::vector<std::string_view> queuing_;
  std::mutex mutex_;
  std::atomic<bool> any_{false};
  std::map<std::string, Armed, std::less<>> armed_;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
