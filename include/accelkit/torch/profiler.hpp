// accelkit: PyTorch's profiler hooks for the backend (PrivateUse1), from the
// runtime's timing events.
//
// Note [Profiler device times]
// torch.autograd.profiler.profile(use_device="<name>") profiles in the mode
// PyTorch calls KINETO_PRIVATEUSE1_FALLBACK: around every operator it asks
// the PrivateUse1 profiler stubs for a mark at entry and one at exit
// (record), and after profiling for the microseconds between the two
// (elapsed), which it reports as the operator's device time. Without stubs
// of the backend's, PyTorch's defaults throw at every mark, which PyTorch
// catches and logs, with a backtrace, per operator.
//
// Here a mark is a timing event of the SDK's pools (DeviceEvent, no driver
// event created per use once the pool is warm) recorded on the calling
// thread's current stream of its current device, so the device time of an
// operator is the stream's time from the work queued before the operator to
// the work it queued, as CUDA's stubs measure it. Three cases get no device
// time (0, which PyTorch reports as none), said here rather than invented:
// the backend not yet initialized at the mark (the profiler never creates a
// device context), the two marks on different devices (an operator that
// changed the current device and left it changed), and a failed driver call
// (reported once through the diagnostics hook, Note [Diagnostics], never
// thrown into PyTorch's profiler). A device whose properties report no event
// timing (properties().event_timing false) gets host times instead: the
// time on the calling thread between the operator's entry and exit, which
// for asynchronous work is the cost of queueing it, not of running it; a
// diagnostic says so once per device.
//
// The stubs' mark, rangePush and rangePop are annotations for a vendor
// tracer (NVTX's on CUDA); the contract has no such member, so they record
// nothing.
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// One mark of Note [Profiler device times]: a timing event recorded on the
// calling thread's current stream of its current device, and the host time.
struct ProfilerMark {
  device_index device = -1;  // -1: no device time
  std::optional<DeviceEvent> event;
  std::int64_t host_ns = 0;  // steady clock
  std::int64_t unix_ns = 0;  // c10::getTime(), the profiler's clock

  static std::shared_ptr<ProfilerMark> now() {
    auto mark = std::make_shared<ProfilerMark>();
    BackendInterface& b = backend();
    if (b.is_initialized() && !b.in_bad_fork()) {
      try {
        mark->device = b.current_device();
        if (timed(mark->device)) {
          mark->event.emplace(EventFlags::timing);
          mark->event->record(b.current_stream(mark->device));
        }
      } catch (const std::exception& e) {
        failed(e.what());
        mark->event.reset();
        mark->device = -1;
      }
    }
    mark->host_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
    mark->unix_ns = c10::getTime();
    return mark;
  }

  // Microseconds from `a` to `z`; 0 when there is no device time.
  static float elapsed_us(ProfilerMark* a, ProfilerMark* z) {
    if (!a || !z || a->device < 0 || a->device != z->device) return 0.0f;
    if (!a->event || !z->event)  // a device without event timing: host times
      return static_cast<float>(z->host_ns - a->host_ns) / 1000.0f;
    try {
      return a->event->elapsed_time(*z->event) * 1000.0f;
    } catch (const std::exception& e) {
      failed(e.what());
      return 0.0f;
    }
  }

 private:
  static constexpr int kDevices = 64;  // devices whose lack of timing is said once each

  // Whether `device` has event timing; says once per device when it has
  // not.
  static bool timed(device_index device) {
    if (backend().properties(device).event_timing) return true;
    static std::atomic<bool> reported[kDevices] = {};
    if (device < kDevices && !reported[device].exchange(true))
      report(Severity::warning, backend_name(),
             fmt::format("{}:{} has no event timing (properties().event_timing is false): the "
                         "profiler's device times for it are host times from each operator's "
                         "entry to its exit, not the device's",
                         backend_name(), device));
    return false;
  }

  // The first failure is reported; later ones only leave their operators
  // without a device time.
  static void failed(const char* what) {
    static std::atomic<bool> reported{false};
    if (!reported.exchange(true))
      report(Severity::warning, backend_name(),
             fmt::format("the profiler could not time an operator on the device, which is left "
                         "without a device time (later failures are not reported): {}",
                         what));
  }
};

class ProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  using EventStub = torch::profiler::impl::ProfilerVoidEventStub;
  using Mark = ProfilerMark;

  void record(c10::DeviceIndex* device, EventStub* event, int64_t* cpu_ns) const override {
    std::shared_ptr<Mark> mark = Mark::now();
    if (device) *device = static_cast<c10::DeviceIndex>(mark->device < 0 ? 0 : mark->device);
    if (cpu_ns) *cpu_ns = mark->unix_ns;
    *event = std::move(mark);
  }

  // Microseconds from `start` to `end` (Note [Profiler device times]).
  float elapsed(const EventStub* start, const EventStub* end) const override {
    return Mark::elapsed_us(start ? static_cast<Mark*>(start->get()) : nullptr,
                            end ? static_cast<Mark*>(end->get()) : nullptr);
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    translated([&] {
      BackendInterface& b = backend();
      int n = b.device_count();
      for (int d = 0; d < n; ++d) {
        DeviceSwitch guard(d);
        op(d);
      }
    });
  }

  // Waits for every device's work (nothing to wait for before the backend
  // is initialized).
  void synchronize() const override {
    translated([&] {
      BackendInterface& b = backend();
      if (!b.is_initialized()) return;
      int n = b.device_count();
      for (int d = 0; d < n; ++d) b.device_synchronize(d);
    });
  }
};

// Registers the backend's stubs with PyTorch's profiler (once; from the
// SDK's library part).
inline void register_profiler() {
  static ProfilerStubs* const stubs = new ProfilerStubs();
  torch::profiler::impl::registerPrivateUse1Methods(stubs);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
