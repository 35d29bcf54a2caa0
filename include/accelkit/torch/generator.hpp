// accelkit: the devices' random number generators (Note [Device generators]).
#pragma once

#include <accelkit/config.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Device generators]: a backend's generators are typed by device, as
// CUDA's are: `torch.Generator(device="<name>:1").device` is that device,
// each device has a default generator (which torch.manual_seed and
// torch.<name>.manual_seed seed), and a random operator on the device
// refuses a generator of another device type in CUDA's words. Their engine
// is the CPU's (mt19937): random operators run the CPU kernel through the
// fallback, so the same seed draws the same numbers as on the CPU. That
// kernel checks that its generator is a CPU one, so the fallback hands it a
// CPU generator that takes the device generator's state for the call and
// gives it back afterwards (GeneratorLease, fallback.hpp). Seeds start at
// PyTorch's default seed (67280421310721), as CUDA's and the CPU's do.
class DeviceGenerator final : public at::CPUGeneratorImpl {
 public:
  DeviceGenerator(std::string_view backend, c10::DeviceIndex device,
                  uint64_t seed = c10::default_rng_seed_val)
      : at::CPUGeneratorImpl(seed), backend_(backend) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, device);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The same checks and exception types as CUDA's (TypeError for another
  // kind of tensor, RuntimeError for another size), in words that name the
  // backend, the device and the sizes.
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_TYPE(state.device().is_cpu() && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                     backend_, ": the RNG state of ", device_,
                     " must be a CPU ByteTensor (as get_rng_state returns), got a ",
                     state.dtype().name(), " tensor on ", state.device());
    const auto expected = static_cast<int64_t>(get_state()->numel());
    TORCH_CHECK(state.numel() == expected && state.is_contiguous(), backend_,
                      ": the RNG state of ", device_, " must be a contiguous ByteTensor of ",
                      expected, " bytes (as get_rng_state returns), got ", state.numel(),
                      state.is_contiguous() ? " bytes" : " bytes, not contiguous");
    at::CPUGeneratorImpl::set_state(state);
  }

  // Copies this generator's engine state to `cpu`, or back (the caller
  // holds both generators' mutexes).
  void copy_state_to(at::CPUGeneratorImpl& cpu) {
    cpu.set_engine(engine());
    cpu.set_next_float_normal_sample(next_float_normal_sample());
    cpu.set_next_double_normal_sample(next_double_normal_sample());
  }
  void copy_state_from(at::CPUGeneratorImpl& cpu) {
    set_engine(cpu.engine());
    set_next_float_normal_sample(cpu.next_float_normal_sample());
    set_next_double_normal_sample(cpu.next_double_normal_sample());
  }

 private:
  // Generator.clone() and graph-safe copies stay on the device.
  DeviceGenerator* clone_impl() const override {
    auto* copy = new DeviceGenerator(backend_, device_.index());
    copy->copy_state_from(const_cast<DeviceGenerator&>(*this));
    return copy;
  }
  std::string_view backend_;  // backend_name(): a literal
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
