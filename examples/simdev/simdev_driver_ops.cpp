// The simulated driver's test knobs as PyTorch operators (torch.ops.simdev_driver),
// built into simdev's backend library beside the registration that
// accelkit_add_torch_backend generates (examples/simdev/CMakeLists.txt).
#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/backend_meta.hpp>

#include "simdev_runtime.hpp"

#include <torch/library.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace {
using Sim = simdev::SimRuntime;
std::mutex gates_mutex;
std::map<int64_t, std::shared_ptr<Sim::Gate>> gates;
int64_t next_gate = 0;

// Takes a held gate out of the table (ValueError naming `op` if unknown).
std::shared_ptr<Sim::Gate> take_gate(int64_t id, const char* op) {
  std::lock_guard<std::mutex> lock(gates_mutex);
  auto it = gates.find(id);
  TORCH_CHECK_VALUE(it != gates.end(), "simdev: ", op, ": no held gate ", id);
  std::shared_ptr<Sim::Gate> gate = std::move(it->second);
  gates.erase(it);
  return gate;
}
}  // namespace

// The knobs, from Python:
// - torch.ops.simdev_driver.inject_fault("memcpy_async", 2) makes the second
//   memcpy_async from now on fail once, as SIMDEV_INJECT_FAULT does from the
//   start; with async=True its queued work fails instead, the error coming
//   at a later call (Note [simdev strictness]); clear_faults() drops those
//   not yet fired;
// - bytes_in_use(device) and pinned_blocks() say what the driver holds;
//   ipc_open_count(), ipc_exported(), ipc_deferred_releases() and
//   ipc_events_open() what it shares with other processes;
// - torch.ops.simdev_driver.copies() counts the driver's memcpy and
//   memcpy_async calls so far, launches() its kernel launches
//   (simdev_kernels.cpp), host_maps() its host_map calls (SIMDEV_HOST_VISIBLE=mapped);
// - gate = torch.ops.simdev_driver.hold(stream) stops `stream` at this point
//   of its queue until torch.ops.simdev_driver.release(gate), so that a test
//   can see work that is still in flight;
// - set_layout_tag(t, "nz") gives a simdev tensor a private layout tag,
//   layout_tag(t) reads it (None: untagged) and set_layout_tag(t, None)
//   removes it: the tensor's backend metadata field "layout"
//   (Note [Backend metadata]), which simdev's kernels do not read, so a
//   test sees what carries it.
TORCH_LIBRARY(simdev_driver, m) {
  m.def("hold(Stream stream) -> int", [](c10::Stream s) {
    return accelkit::torch_adapter::translated([&] {
      namespace ta = accelkit::torch_adapter;
      accelkit::StreamHandle h = ta::backend().handle(ta::from_c10(s));
      auto& backend = accelkit::Backend<Sim>::instance();
      std::shared_ptr<Sim::Gate> gate = backend.runtime().hold(backend.physical(s.device_index()), h);
      // Queued through the runtime, which the SDK does not see: said for the
      // profiler (Note [Device work of an operator]).
      accelkit::torch_adapter::note_device_work();
      std::lock_guard<std::mutex> lock(gates_mutex);
      gates.emplace(next_gate, std::move(gate));
      return next_gate++;
    });
  });
  m.def("copies() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().copies());
  });
  m.def("launches() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().launches());
  });
  m.def("host_maps() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().host_maps());
  });
  m.def("release(int gate) -> ()", [](int64_t id) { take_gate(id, "release")->open(); });
  // Opens the gate after `ms` milliseconds, from a thread of its own: for a
  // test whose next call blocks until the stream moves (it holds the GIL).
  m.def("release_later(int gate, int ms) -> ()", [](int64_t id, int64_t ms) {
    std::shared_ptr<Sim::Gate> gate = take_gate(id, "release_later");
    std::thread([gate, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      gate->open();
    }).detach();
  });
  m.def("inject_fault(str member, int nth=1, bool async=False) -> ()",
        [](std::string member, int64_t nth, bool async) {
          TORCH_CHECK_VALUE(nth >= 1 && nth <= 1'000'000'000,
                            "simdev: inject_fault: nth must be in 1..1e9, got ", nth);
          accelkit::torch_adapter::translated([&] {
            accelkit::Backend<Sim>::instance().runtime().inject_fault(member, static_cast<int>(nth),
                                                                      async);
          });
        });
  m.def("fault_pending(str member) -> bool", [](std::string member) {
    return accelkit::Backend<Sim>::instance().runtime().fault_pending(member);
  });
  m.def("clear_faults() -> ()", [] { accelkit::Backend<Sim>::instance().runtime().clear_faults(); });
  // Bytes the driver holds on a device (physical index), and pinned blocks.
  m.def("bytes_in_use(int device) -> int", [](int64_t d) {
    return accelkit::torch_adapter::translated([&] {
      auto& b = accelkit::Backend<Sim>::instance();
      return static_cast<int64_t>(b.runtime().bytes_in_use(b.physical(static_cast<int>(d))));
    });
  });
  // Inter-process memory and events in this process (Note [simdev
  // inter-process memory]): memory of other processes open here, allocations
  // exported, freed allocations another process still holds, events opened.
  m.def("ipc_open_count() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().ipc_open_count());
  });
  m.def("ipc_exported() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().ipc_exported());
  });
  m.def("ipc_deferred_releases() -> int", [] {
    return static_cast<int64_t>(
        accelkit::Backend<Sim>::instance().runtime().ipc_deferred_releases());
  });
  m.def("ipc_events_open() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().ipc_events_open());
  });
  m.def("set_layout_tag(Tensor t, str? tag) -> ()",
        [](const at::Tensor& t, std::optional<std::string> tag) {
          namespace ta = accelkit::torch_adapter;
          if (!tag) return ta::erase_backend_meta(t, "layout");
          TORCH_CHECK_VALUE(!tag->empty(),
                            "simdev: set_layout_tag: a layout tag is not empty (None removes it)");
          ta::set_backend_meta(t, "layout", *tag);
        });
  m.def("layout_tag(Tensor t) -> str?", [](const at::Tensor& t) {
    return accelkit::torch_adapter::backend_meta(t, "layout");
  });
  m.def("pinned_blocks() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().pinned_blocks());
  });
}
