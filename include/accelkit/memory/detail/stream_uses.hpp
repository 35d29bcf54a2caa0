// accelkit: ordering a freed block after the streams that used it (both
// memory pools).
//
// Note [Stream-use recording]
// A block freed after use on streams other than its own (record_stream) may
// be reused only once those streams are past the use. For each use an event
// is recorded on its stream, from the device's pooled events, and the pool
// reuses the block once the events have completed. If the driver refuses
// the record, the free waits for the stream instead, and says so through
// the diagnostics hook (the error may be one of earlier queued work, which
// the driver reports once). If the wait fails too, nothing can order the
// block after that use: it is quarantined, never reused, and goes back to
// the driver only at teardown (the device pool leaves it in its segment,
// the pinned pool keeps it on a list); the events recorded for it are
// released. Both pools use record_stream_uses below, so they behave alike.
// The device pool defers the free of a block used on a capturing stream,
// where no event may be recorded (Note [Frees during capture]).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/diagnostics.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <exception>
#include <string_view>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Which pending frees a pool returns to its cache: those whose events have
// completed, or all of them, waiting for each event.
enum class Drain : bool { completed, wait_for_all };

// Records an event for each (device, stream) of `uses` into `events`, or
// waits for the stream (Note [Stream-use recording]). False when a use could
// be neither recorded nor waited for: the block must not be reused, and
// `events` is released and emptied. `events_of(device)` is that device's
// EventPool; `what` names the block in reports ("pinned host memory at
// 0x7f..."). Never throws after `events` has room for every use.
// `what()` describes the block for the reports; it is called only when there
// is something to report (a free must not pay for formatting otherwise).
template <class R, class Uses, class EventsOf, class What>
bool record_stream_uses(Backend<R>& backend, const Uses& uses, EventsOf&& events_of,
                        std::vector<std::pair<device_index, EventHandle>>& events, What&& what) {
  if (uses.empty()) return true;
  bool safe = true;
  events.reserve(events.size() + uses.size());  // so that keeping an event cannot throw
  for (const auto& [device, stream] : uses) {
    try {
      events.emplace_back(device, events_of(device).record(stream));
      continue;
    } catch (const std::exception& err) {
      report(Severity::warning, R::name,
             fmt::format("the free of {} waits for stream {:#x} of device {} instead of "
                         "recording an event: {}",
                         what(), stream.value, device, err.what()));
    }
    try {
      backend.stream_synchronize(device, stream);
    } catch (const std::exception& err) {
      report(Severity::warning, R::name,
             fmt::format("{} is kept out of the cache: its use on stream {:#x} of device {} "
                         "cannot be waited for: {}",
                         what(), stream.value, device, err.what()));
      safe = false;
    }
  }
  if (!safe) {
    for (auto [device, e] : events) events_of(device).release(e);
    events.clear();
  }
  return safe;
}

}  // namespace detail
ACCELKIT_END_NAMESPACE
