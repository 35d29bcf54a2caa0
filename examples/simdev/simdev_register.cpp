// simdev as a PyTorch backend: the one registration line a vendor writes.
#include <accelkit/torch/register.hpp>

#include "simdev_runtime.hpp"

#include <map>
#include <memory>
#include <mutex>

ACCELKIT_REGISTER_BACKEND(simdev::SimRuntime);

namespace {
using Sim = simdev::SimRuntime;
std::mutex gates_mutex;
std::map<int64_t, std::shared_ptr<Sim::Gate>> gates;
int64_t next_gate = 0;
}  // namespace

// The simulated driver's test knobs, from Python (not part of the backend a
// vendor generates):
// - torch.ops.simdev_driver.inject_fault("memcpy_async", 2) makes the second
//   memcpy_async from now on fail once, as SIMDEV_INJECT_FAULT does from the
//   start;
// - torch.ops.simdev_driver.copies() counts the driver's memcpy and
//   memcpy_async calls so far;
// - gate = torch.ops.simdev_driver.hold(stream) stops `stream` at this point
//   of its queue until torch.ops.simdev_driver.release(gate), so that a test
//   can see work that is still in flight.
TORCH_LIBRARY(simdev_driver, m) {
  m.def("hold(Stream stream) -> int", [](c10::Stream s) {
    return accelkit::torch_adapter::translated([&] {
      auto& st = accelkit::torch_adapter::State<Sim>::get();
      accelkit::StreamHandle h = st.streams().handle(st.from_c10(s));
      auto& backend = accelkit::Backend<Sim>::instance();
      std::shared_ptr<Sim::Gate> gate = backend.runtime().hold(backend.physical(s.device_index()), h);
      std::lock_guard<std::mutex> lock(gates_mutex);
      gates.emplace(next_gate, std::move(gate));
      return next_gate++;
    });
  });
  m.def("copies() -> int", [] {
    return static_cast<int64_t>(accelkit::Backend<Sim>::instance().runtime().copies());
  });
  m.def("release(int gate) -> ()", [](int64_t id) {
    std::shared_ptr<Sim::Gate> gate;
    {
      std::lock_guard<std::mutex> lock(gates_mutex);
      auto it = gates.find(id);
      TORCH_CHECK_VALUE(it != gates.end(), "simdev: release: no held gate ", id);
      gate = std::move(it->second);
      gates.erase(it);
    }
    gate->open();
  });
  m.def("inject_fault(str member, int nth=1) -> ()", [](std::string member, int64_t nth) {
    TORCH_CHECK_VALUE(nth >= 1, "simdev: inject_fault: nth must be at least 1, got ", nth);
    accelkit::Backend<Sim>::instance().runtime().inject_fault(member, static_cast<int>(nth));
  });
}
