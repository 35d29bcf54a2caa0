// accelkit: the streams that are capturing a graph, and what a capture
// refuses (Note [Capture rules]), for Backend<R>.
//
// Note [Capture rules]
// Problem: work queued on a capturing stream is recorded, not run, so a call
// that waits for or asks about that work (synchronize, query, an event
// recorded on the stream or waited for by it) cannot mean what it says
// during the capture; CUDA refuses such calls and invalidates the capture,
// and PyTorch code is written against that. Drivers differ in what they
// notice, and a runtime without graphs notices nothing.
// Decision: the SDK keeps its own registry of captures (device, stream,
// mode, the thread that began it, and why it was invalidated, if it was),
// and checks, in Backend<R>, before the runtime is called:
//   - stream_synchronize, stream_query, event_record, stream_wait_event,
//     stream_wait_signal, stream_wait_peer_event, memcpy_peer_async,
//     graph_launch, stream_destroy, and memcpy_async of pageable host
//     memory, naming a capturing stream: refused, that capture invalidated;
//   - device_synchronize of a device with a capture underway: refused, each
//     of its captures invalidated;
//   - event_query, event_synchronize and the synchronous memcpy on a device
//     with a capture in mode global (begun by any thread), or in mode
//     per_thread begun by the calling thread: refused, those captures
//     invalidated; relaxed captures allow them;
//   - capture_refuse: what the torch layer cannot capture (a host kernel, the
//     CPU fallback, a pageable copy) invalidates the stream's capture.
// A refusal is a RuntimeError naming the call, the device, the stream, the
// mode, and saying the capture is invalidated. A stream is captured once at
// a time (a second begin is a RuntimeError, the first capture unharmed).
// stream_end_capture of an invalidated capture ends the runtime's capture,
// destroys the graph it gave, forgets the capture and throws a RuntimeError
// naming the call that invalidated it; the stream is then usable, not
// capturing. The checks cost one relaxed atomic load when no capture is
// underway in the process; otherwise they take the registry's mutex.
// Limits: the SDK sees only calls made through Backend<R>; a vendor kernel
// that synchronizes by itself, or code calling the runtime directly, is the
// driver's to refuse (simdev does: Note [simdev strictness]). A capture
// records one stream: no fork and join through events. The rules are per
// device, where CUDA's global mode is process-wide. The default stream is
// refused by the layer that knows which stream it is (the torch layer).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

class Captures {
 public:
  struct Capture {
    device_index device = 0;
    StreamHandle stream{};
    CaptureMode mode = CaptureMode::global;
    std::thread::id thread{};
    std::string invalidated;  // why, or empty while the capture is valid
  };

  explicit Captures(std::string_view backend) : backend_(backend) {}

  // Whether any capture is underway: the checks' fast path, one load.
  bool any() const noexcept { return count_.load(std::memory_order_relaxed) != 0; }

  // Registers the capture of `stream`; RuntimeError if it is capturing.
  void begin(device_index device, StreamHandle stream, CaptureMode mode) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const Capture* c = find(device, stream))
      throw RuntimeError(
          backend_,
          fmt::format("stream_begin_capture: stream {:#x} of device {} is capturing already "
                      "(mode {}, begun by {}); end that capture first",
                      stream.value, device, to_string(c->mode),
                      c->thread == std::this_thread::get_id() ? "this thread" : "another thread"));
    captures_.push_back(Capture{device, stream, mode, std::this_thread::get_id(), {}});
    count_.fetch_add(1, std::memory_order_relaxed);
  }

  // Forgets the capture of `stream` and returns it; nullopt if none.
  std::optional<Capture> end(device_index device, StreamHandle stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(captures_.begin(), captures_.end(), [&](const Capture& c) {
      return c.device == device && c.stream == stream;
    });
    if (it == captures_.end()) return std::nullopt;
    Capture c = std::move(*it);
    captures_.erase(it);
    count_.fetch_sub(1, std::memory_order_relaxed);
    return c;
  }

  // A copy of the capture of `stream`; nullopt if none.
  std::optional<Capture> get(device_index device, StreamHandle stream) const {
    if (!any()) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    if (const Capture* c = find(device, stream)) return *c;
    return std::nullopt;
  }

  bool is_capturing(device_index device, StreamHandle stream) const {
    if (!any()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return find(device, stream) != nullptr;
  }

  bool underway(device_index device) const noexcept {
    if (!any()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return std::any_of(captures_.begin(), captures_.end(),
                       [&](const Capture& c) { return c.device == device; });
  }

  // A call that names `stream`: refused if it is capturing, the capture
  // invalidated.
  void check_stream(device_index device, StreamHandle stream, std::string_view call) {
    if (!any()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Capture* c = find(device, stream);
    if (c == nullptr) return;
    invalidate(*c, fmt::format("{} of the capturing stream", call));
    throw RuntimeError(backend_, fmt::format("{} of stream {:#x} of device {}, which is "
                                             "capturing a graph (mode {}): not allowed during "
                                             "capture; the capture is invalidated",
                                             call, stream.value, device, to_string(c->mode)));
  }

  // device_synchronize: refused while any capture of `device` is underway,
  // each invalidated.
  void check_device(device_index device, std::string_view call) {
    if (!any()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_matching(device, call, [](const Capture&) { return true; });
  }

  // event_query, event_synchronize, memcpy: refused while `device` has a
  // capture in mode global, or in mode per_thread begun by this thread.
  void check_blocking(device_index device, std::string_view call) {
    if (!any()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto self = std::this_thread::get_id();
    refuse_matching(device, call, [&](const Capture& c) {
      return c.mode == CaptureMode::global ||
             (c.mode == CaptureMode::per_thread && c.thread == self);
    });
  }

  // What the caller cannot capture: invalidates the capture of `stream` (if
  // it is capturing) and throws.
  [[noreturn]] void refuse(device_index device, StreamHandle stream, std::string_view what) {
    std::string state = "which is not capturing";
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (Capture* c = find(device, stream)) {
        invalidate(*c, std::string(what));
        state = fmt::format("capturing in mode {}; the capture is invalidated", to_string(c->mode));
      }
    }
    throw RuntimeError(backend_, fmt::format("{} cannot be captured into a graph (stream {:#x} "
                                             "of device {}, {})",
                                             what, stream.value, device, state));
  }

 private:
  const Capture* find(device_index device, StreamHandle stream) const {
    for (const Capture& c : captures_)
      if (c.device == device && c.stream == stream) return &c;
    return nullptr;
  }
  Capture* find(device_index device, StreamHandle stream) {
    return const_cast<Capture*>(std::as_const(*this).find(device, stream));
  }

  static void invalidate(Capture& c, std::string reason) {
    if (c.invalidated.empty()) c.invalidated = std::move(reason);
  }

  template <class Pred>
  void refuse_matching(device_index device, std::string_view call, Pred pred) {
    std::string which;
    for (Capture& c : captures_) {
      if (c.device != device || !pred(c)) continue;
      invalidate(c, std::string(call));
      if (!which.empty()) which += ", ";
      which += fmt::format("stream {:#x} (mode {})", c.stream.value, to_string(c.mode));
    }
    if (which.empty()) return;
    throw RuntimeError(backend_, fmt::format("{} on device {} while it captures a graph on {}: "
                                             "not allowed during capture; the capture is "
                                             "invalidated",
                                             call, device, which));
  }

  std::string backend_;
  std::atomic<int> count_{0};
  mutable std::mutex mutex_;
  std::vector<Capture> captures_;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
