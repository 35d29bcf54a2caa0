// accelkit: the backend's device activity in torch.profiler (Kineto).
//
// Note [Kineto device activities]
// torch.profiler.profile(activities=[ProfilerActivity.CPU,
// ProfilerActivity.PrivateUse1]) (or profile(use_device="<name>",
// use_kineto=True)) traces through Kineto. Kineto asks every activity
// profiler registered with it for a session when tracing starts, hands each
// session the correlation id of every operator as the operator starts and
// ends (pushCorrelationId / popCorrelationId, on the operator's thread), and
// at the end collects the session's activities (processTrace), with a
// callback that finds the CPU activity of a correlation id. PyTorch 2.13
// registers a backend's profiler with Kineto through
// REGISTER_PRIVATEUSE1_PROFILER's registry (privateuse1_profiler.h).
//
// The session marks the stream at every push and pop (ProfilerMark: a
// timing event on the thread's current stream, Note [Profiler device
// times]), so the marks of one thread cut its stream's time into intervals,
// each belonging to the innermost operator running then. An interval in
// which the thread did no device work (Note [Device work of an operator]:
// the count did not move between its marks) is dropped, and an operator
// all of whose own intervals were dropped gets no activity: a view, an
// allocation, a dtype conversion of a CPU scalar has no kernel to show, as
// on CUDA, and each activity costs PyTorch's Python post-processing as much
// as an operator does. Each other operator becomes one device activity (a
// kernel, in Kineto's words) of its device, linked to the operator, lasting
// the device time of its own intervals with work (its children's are
// theirs: PyTorch adds the children's device time into a parent's total, as
// for CUDA kernels launched by nested operators). What the marks cannot say
// is when the device started the work: the activity is placed at the
// operator's start on the host. Operators with no device time (before the
// backend is initialized, across devices) get no activity either.
#pragma once

#include <accelkit/torch/profiler.hpp>

#if defined(USE_KINETO) && defined(__has_include)
#if __has_include(<IActivityProfiler.h>) && \
    __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>)
#define ACCELKIT_TORCH_KINETO 1
#endif
#endif
#ifndef ACCELKIT_TORCH_KINETO
#define ACCELKIT_TORCH_KINETO 0
#endif

#if ACCELKIT_TORCH_KINETO
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <TraceSpan.h>
#include <libkineto.h>  // CpuTraceBuffer, complete
#include <output_base.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

class KinetoSession final : public libkineto::IActivityProfilerSession {
 public:
  using Mark = ProfilerMark;

  explicit KinetoSession(bool device_activities)
      : id_(next_id()), device_activities_(device_activities) {}

  void start() override { recording_.store(device_activities_); }
  void stop() override { recording_.store(false); }
  std::vector<std::string> errors() override { return {}; }

  void pushCorrelationId(uint64_t id) override {
    if (!recording_.load(std::memory_order_relaxed)) return;
    Thread& t = thread();
    std::shared_ptr<Mark> m = cut(t);
    t.stack.push_back(Frame{id, m->device, m->unix_ns, false, {}});
  }
  void popCorrelationId() override {
    Thread& t = thread();
    if (t.stack.empty()) return;  // pushed before start
    cut(t);
    Frame f = std::move(t.stack.back());
    t.stack.pop_back();
    if (!f.worked || f.device < 0) return;  // no activity to show
    std::lock_guard<std::mutex> lock(mutex_);
    done_.push_back(std::move(f));
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }
  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    std::vector<Frame> frames;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      frames.swap(done_);
    }
    for (Frame& f : frames) {
      double us = 0;
      for (auto& [a, z] : f.intervals) us += Mark::elapsed_us(a.get(), z.get());
      const libkineto::ITraceActivity* op =
          linked ? linked(static_cast<int32_t>(f.correlation)) : nullptr;
      libkineto::GenericTraceActivity a(span(), libkineto::ActivityType::CONCURRENT_KERNEL,
                                        op ? op->name() : std::string(backend_name()));
      // Not before its operator (whose start PyTorch takes just after the push).
      a.startTime = op ? std::max<int64_t>(f.start_ns, op->timestamp()) : f.start_ns;
      a.endTime = a.startTime + static_cast<int64_t>(us * 1000.0);
      a.id = static_cast<int32_t>(f.correlation);
      a.device = f.device;
      a.linked = op;
      a.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  struct Frame {
    uint64_t correlation;
    device_index device;  // of its first mark; -1: no device time
    int64_t start_ns;     // c10::getTime() at its start
    bool worked;          // some interval of its own had device work
    std::vector<std::pair<std::shared_ptr<Mark>, std::shared_ptr<Mark>>> intervals;
  };
  // A thread's operators in flight and its last mark, for one session.
  struct Thread {
    uint64_t session = 0;
    std::vector<Frame> stack;
    std::shared_ptr<Mark> last;
    std::uint64_t work = 0;  // device_work at the last mark
  };

  static uint64_t next_id() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }
  Thread& thread() {
    static thread_local Thread t;
    if (t.session != id_) t = Thread{id_, {}, nullptr, device_work};
    return t;
  }
  // A new mark: the interval since the thread's last one is the innermost
  // operator's, if the thread did device work in it.
  std::shared_ptr<Mark> cut(Thread& t) {
    std::shared_ptr<Mark> m = Mark::now();
    if (device_work != t.work && !t.stack.empty() && t.last &&
        t.stack.back().device == m->device) {
      t.stack.back().intervals.emplace_back(t.last, m);
      t.stack.back().worked = true;
    }
    t.work = device_work;
    t.last = m;
    return m;
  }
  // Activities point to their span; Kineto's logger copies them, so it
  // lives as long as the process.
  static const libkineto::TraceSpan& span() {
    static const libkineto::TraceSpan* const s =
        new libkineto::TraceSpan(0, 0, std::string(backend_name()));
    return *s;
  }

  uint64_t id_;
  bool device_activities_;
  std::atomic<bool> recording_{false};
  std::mutex mutex_;
  std::vector<Frame> done_;
};

class KinetoProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    return std::make_unique<KinetoSession>(types.count(kKernel) != 0);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  static constexpr libkineto::ActivityType kKernel = libkineto::ActivityType::CONCURRENT_KERNEL;
  std::string name_{std::string("accelkit.") + std::string(backend_name())};
  std::set<libkineto::ActivityType> activities_{kKernel};
};

// Registers the backend's activity profiler with Kineto (once).
inline void register_kineto_profiler() {
  static const ::torch::profiler::impl::RegisterPrivateUse1Profiler<KinetoProfiler> once;
  static_cast<void>(once);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

#else
ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Built without Kineto's headers (USE_KINETO and <torch>/include/kineto on
// the include path, as the accelkit::torch target sets when the wheel has
// them): torch.profiler records no device activity of the backend.
inline void register_kineto_profiler() {}
}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
#endif

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Both of the backend's profilers: the stubs of torch.autograd.profiler's
// device times (Note [Profiler device times]) and Kineto's device
// activities (Note [Kineto device activities]). From the SDK's library part (registration.hpp).
inline void register_profilers() {
  register_profiler();
  register_kineto_profiler();
}
}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
