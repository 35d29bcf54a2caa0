// accelkit: host signals (Note [Host signals] in device/backend.hpp) as
// operators of the backend's library, torch.ops.<name>.*, for the SDK's
// Python package: accelkit.distributed makes the current stream wait for a
// collective that runs on host threads. Compiled once, in the library part
// (Note [Backend interface]).
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Devices are logical indices (a Stream's own); signals cross as the
// handle's integer value.
inline device_index signal_device(int64_t d) {
  TORCH_CHECK_INDEX(d >= 0 && d <= std::numeric_limits<int>::max(), backend_name(),
                    ": invalid device index ", d);
  return static_cast<device_index>(d);
}

inline void register_signal_ops(::torch::Library& lib) {
  // Whether streams wait for signals on the device (the runtime has the
  // members); false: stream_wait_signal blocks the calling thread.
  lib.def("stream_signals() -> bool", [] { return backend().has_stream_signals(); });
  lib.def("signal_create(int device) -> int", [](int64_t d) {
    return translated([&] {
      return static_cast<int64_t>(
          backend().signal_create(signal_device(d)).value);
    });
  });
  lib.def("stream_wait_signal(Stream stream, int signal) -> ()", [](c10::Stream s, int64_t g) {
    translated([&] {
      StreamHandle h = backend().handle(from_c10(s));
      // Queued through the backend, not the SDK's stream layer: said for
      // the profiler (Note [Device work of an operator]).
      note_device_work();
      backend().stream_wait_signal(static_cast<device_index>(s.device_index()), h,
                                      SignalHandle{static_cast<std::uintptr_t>(g)});
    });
  });
  // `reason`: what failed, kept by the streams that waited (Note [Failed
  // waits] in device/failed_waits.hpp).
  lib.def("signal_complete(int device, int signal, int error, str reason=\"\") -> ()",
          [](int64_t d, int64_t g, int64_t error, std::string reason) {
            TORCH_CHECK_VALUE(error >= std::numeric_limits<int>::min() &&
                                  error <= std::numeric_limits<int>::max(),
                              backend_name(), ": signal_complete: error ", error, " does not fit an int");
            translated([&] {
              backend().signal_complete(signal_device(d),
                                                     SignalHandle{static_cast<std::uintptr_t>(g)},
                                                     static_cast<int>(error),
                                                     std::move(reason));
            });
          });
  lib.def("signal_destroy(int device, int signal) -> ()", [](int64_t d, int64_t g) {
    translated([&] {
      backend().signal_destroy(signal_device(d),
                                            SignalHandle{static_cast<std::uintptr_t>(g)});
    });
  });
  // The SDK's own stream of a device, made at its first use: never a pool or
  // default stream, so never one that user code makes wait for a signal. The
  // SDK's Python package queues there the device work its host threads do
  // before they complete a signal (a staged collective's copy back), which
  // a stream waiting for that signal must not hold up.
  lib.def("sdk_stream(int device) -> Stream", [](int64_t d) {
    return translated([&] {
      static std::mutex mutex;
      static std::map<device_index, Stream> made;
      device_index i = signal_device(d);
      std::lock_guard<std::mutex> lock(mutex);
      auto it = made.find(i);
      if (it == made.end()) it = made.emplace(i, backend().create_stream(i, 0)).first;
      return to_c10(it->second);
    });
  });
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
