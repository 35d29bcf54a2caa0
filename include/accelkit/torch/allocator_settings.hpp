// accelkit: PyTorch's run-time allocator settings reach the backend's
// allocators.
//
// Note [Allocator settings hook]
// torch._C._accelerator_setAllocatorSettings(s) (and
// torch.<name>.memory._set_allocator_settings(s)) calls c10's
// setAllocatorSettings: c10 parses s for the keys it knows
// (AcceleratorAllocatorConfig), then calls the one device config parser
// hook. register_allocator_settings() installs a hook that calls the hook
// registered before it (a CUDA build's), then applies s over the settings of
// the backend's device and pinned allocators and of those made later
// (Note [Run-time allocator settings]); an accelkit error becomes the
// PyTorch error of its kind (a ValueError naming the key and value).
// Once a hook is registered, c10 refuses (ValueError) every key not
// registered with it, and registering a key it knows throws; so the keys
// AllocatorConfig parses that c10 does not know yet are registered
// (per_process_memory_fraction, the pinned size keys, CUDA's other keys,
// which the parser accepts at their defaults or refuses saying why).
// c10 parses PYTORCH_ALLOC_CONF itself at its first use, after this
// registration where the backend loads first: an unknown key there is its
// ValueError too. Limits: c10 parses s first, so a malformed value of a key
// c10 knows gets c10's message (e.g. "stoull"), and c10 keeps its own copy
// of what it parsed. The environment is read by the allocators themselves
// (AllocatorConfig::from_environment), not through c10.
#pragma once

#include <accelkit/torch/common.hpp>  // first (Note [fmt beside libtorch])
#include <accelkit/memory/config.hpp>
#include <accelkit/torch/errors.hpp>

#include <c10/core/AllocatorConfig.h>

#include <functional>
#include <string>
#include <unordered_set>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Installs the hook of Note [Allocator settings hook], once per process.
inline void register_allocator_settings() {
  // A function-local static, not std::call_once: a std template instantiated
  // on a lambda would be a symbol the module exports.
  static const bool registered = [] {
    using c10::CachingAllocator::AcceleratorAllocatorConfig;
    std::function<void(const std::string&)> previous =
        AcceleratorAllocatorConfig::getConfigParserHook();
    const std::unordered_set<std::string>& known = AcceleratorAllocatorConfig::getKeys();
    std::unordered_set<std::string> keys;
    for (std::string_view key : AllocatorConfig::kCudaKeys)
      if (known.find(std::string(key)) == known.end()) keys.emplace(key);
    AcceleratorAllocatorConfig::registerDeviceConfigParserHook(
        [previous = std::move(previous)](const std::string& settings) {
          if (previous) previous(settings);
          translated([&] {
            AllocatorSettings::process().apply(
                backend_name(), "torch._C._accelerator_setAllocatorSettings", settings);
          });
        },
        keys);
    return true;
  }();
  static_cast<void>(registered);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
