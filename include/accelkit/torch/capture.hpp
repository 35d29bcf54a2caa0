// accelkit: what the torch layer does while a stream captures a graph: the
// refusal of what cannot be captured, naming the ATen operator, and the
// pinned storages a capture keeps alive. The graph itself: torch/graph.hpp.
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/errors.hpp>

#include <fmt/format.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Refusals during capture]
// Problem: work queued on a capturing stream is recorded, not run (Note
// [Capture rules]); what the torch layer does on the host cannot be
// recorded: a host kernel (PyTorch's CPU kernel run on device memory, Note
// [Host kernels]), the CPU fallback (device memory copied to the CPU and
// back), a copy between the device and pageable host memory (.item(),
// .cpu(), print: the host reads the result at once), a fill or a strided
// copy done by the host. Each of them first waits for the stream, which the
// SDK refuses during capture, but that error names stream_synchronize, not
// what the user wrote.
// Decision: each of those paths asks first whether the current stream of
// the device it works on is capturing (one relaxed load when no capture is
// underway on the device: Backend<R>::capture_underway) and, if so, refuses
// through Backend<R>::capture_refuse, naming the ATen operator and why: the
// capture is invalidated (CUDA's rule: the graph's end then fails, naming
// the operator) and the stream is usable again once the capture ends. What
// the device itself runs is captured: the runtime's kernels, memset_async,
// device-to-device copies, and copies with pinned host memory (Note
// [Captured pinned copies]).
// Limits: the check looks at the current stream of the devices of the
// operator's tensor arguments; host work on another thread's stream is that
// thread's own business (the SDK's rules for the blocking calls still
// apply: Note [Capture rules]). A path not listed here that waits for the
// stream is refused by the SDK's check, naming the call.

// The current stream of device d, if it is capturing.
inline std::optional<StreamHandle> capturing_stream(device_index d) {
  BackendInterface& b = backend();
  if (!b.capture_underway(d)) return std::nullopt;
  StreamHandle h = b.current_handle(d);
  if (!b.stream_is_capturing(d, h)) return std::nullopt;
  return h;
}

// Refuses what() on d's current stream when that stream is capturing (Note
// [Refusals during capture]); what() is called only then.
template <class What>
void refuse_if_capturing(device_index d, What&& what) {
  std::optional<StreamHandle> h = capturing_stream(d);
  if (!h) return;
  translated([&] { backend().capture_refuse(d, *h, what()); });
}

// "aten::add.Tensor" from an operator's name and overload name.
inline std::string operator_name(const char* name, const char* overload) {
  return overload && *overload ? fmt::format("{}.{}", name, overload) : std::string(name);
}

// Note [Captured pinned copies]
// Problem: a copy between the device and pinned host memory queued on a
// capturing stream reads or writes that memory at every replay, and no
// event can be recorded on a capturing stream to keep the pinned block from
// reuse after its tensor is freed (the pool's record_stream).
// Decision: the graph that captures the stream keeps the pinned storage
// alive (a reference to it) until the graph is reset; no record_stream is
// made for the captured copy.
// Limits: only copies made by the torch layer's own copy operators are kept;
// pinned memory that vendor code copies during a capture is its owner's to
// keep alive, as the static inputs of any graph are.
class CaptureKeeps {
 public:
  static CaptureKeeps& get() {
    static CaptureKeeps* const k = new CaptureKeeps();  // used from static destructors
    return *k;
  }
  // The storages kept for the capture of stream h of device d go to `into`
  // (the graph's own list) from now until forget(d, h).
  void watch(device_index d, StreamHandle h, std::vector<c10::Storage>* into) {
    std::lock_guard<std::mutex> lock(mutex_);
    watched_.push_back(Watched{d, h, into});
  }
  void forget(device_index d, StreamHandle h) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = watched_.begin(); it != watched_.end(); ++it)
      if (it->device == d && it->stream == h) {
        watched_.erase(it);
        return;
      }
  }
  // Keeps `s` alive with the capture of stream h of device d; false when no
  // graph of the torch layer captures that stream.
  bool keep(device_index d, StreamHandle h, const c10::Storage& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Watched& w : watched_)
      if (w.device == d && w.stream == h) {
        for (const c10::Storage& k : *w.into)
          if (k.is_alias_of(s)) return true;
        w.into->push_back(s);
        return true;
      }
    return false;
  }

 private:
  struct Watched {
    device_index device;
    StreamHandle stream;
    std::vector<c10::Storage>* into;
  };
  std::mutex mutex_;
  std::vector<Watched> watched_;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
