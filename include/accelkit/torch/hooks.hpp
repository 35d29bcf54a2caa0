// accelkit: the backend's PrivateUse1 hooks (at::PrivateUse1HooksInterface):
// availability, the current device, pinned memory, pointers' devices and
// the devices' generators.
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/device_allocator.hpp>
#include <accelkit/torch/errors.hpp>
#include <accelkit/torch/generator.hpp>
#include <accelkit/torch/pinned_allocator.hpp>

#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <optional>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  // Never throws and never creates a device context.
  bool isAvailable() const override { return backend().device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return backend().is_initialized();
  }
  void init() const override {
    translated([&] { backend().lazy_init(); });
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(backend().device_count());
  }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    translated([&] { backend().set_device(d); });
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return translated([&] { return static_cast<c10::DeviceIndex>(backend().current_device()); });
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return translated([&] { return static_cast<c10::DeviceIndex>(backend().exchange_device(d)); });
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  bool isPinnedPtr(const void* p) const override {
    return p && backend().is_initialized() && backend().host_is_allocation(p);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  at::Device getDeviceFromPtr(void* p) const override {
    return translated([&] {
      std::optional<device_index> d = device_holding(p);
      TORCH_CHECK(d, backend_name(), ": pointer ", p, " is not memory of any ", backend_name(), " device");
      return at::Device(kDeviceType, static_cast<c10::DeviceIndex>(*d));
    });
  }

  // Note [Device generators].
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    static std::vector<at::Generator> generators = [] {
      std::vector<at::Generator> g;
      int n = backend().device_count();
      for (int i = 0; i < n; ++i)
        g.push_back(at::make_generator<DeviceGenerator>(backend_name(), static_cast<c10::DeviceIndex>(i)));
      return g;
    }();
    // Neither the check nor the current device initializes the backend:
    // torch.manual_seed seeds every device's generator. Before
    // initialization every thread's device is 0.
    return generators[static_cast<std::size_t>(generator_device(d))];
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return at::make_generator<DeviceGenerator>(backend_name(), generator_device(d));
  }

  // A generator's device: -1 is the current one; IndexError unless visible.
  static c10::DeviceIndex generator_device(c10::DeviceIndex d) {
    BackendInterface& b = backend();
    if (d != -1) translated([&] { b.check_visible(d); });
    if (d == -1) d = b.is_initialized() ? translated([&] { return b.current_device(); }) : 0;
    return d;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t newsize) const override;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
