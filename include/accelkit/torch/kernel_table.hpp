// accelkit: the table through which the SDK's ATen kernels and a vendor's
// are registered for the backend (Note [Vendor kernel registration] in
// torch/kernels.hpp).
#pragma once

#include <accelkit/torch/common.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// The backend's ATen kernels, the SDK's and the vendor's (Note [Vendor
// kernel registration]): one table per module. Never destroyed, as the
// backend.
class KernelTable {
 public:
  static KernelTable& get() {
    static KernelTable* const table = new KernelTable();
    return *table;
  }

  // The SDK's kernel of `name` ("add.Tensor"), unless the vendor has one.
  template <class F>
  void impl(const char* name, F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string key = canonical(name);
    if (vendor_.count(key)) return;
    auto lib = library(__FILE__, __LINE__);
    lib->impl(name, std::forward<F>(f));
    sdk_[key] = std::move(lib);
  }

  // The vendor's kernel of `name`, replacing the SDK's.
  template <class F>
  void vendor_impl(const char* name, F&& f, const char* file, unsigned line) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string key = canonical(name);
    auto [it, added] = vendor_.try_emplace(key, Where{file, line, nullptr});
    TORCH_CHECK(added, backend_name(), ": two vendor kernels for aten::", key, ": at ", it->second.file,
                ":", it->second.line, " and at ", file, ":", line);
    sdk_.erase(key);  // deregisters the SDK's kernel
    try {
      it->second.lib = library(file, line);
      it->second.lib->impl(name, std::forward<F>(f));
    } catch (...) {
      vendor_.erase(it);
      throw;
    }
  }

  // Whether the vendor registered a kernel for `name`.
  bool vendor_has(const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    return vendor_.count(canonical(name)) != 0;
  }

 private:
  struct Where {
    const char* file;
    unsigned line;
    std::unique_ptr<torch::Library> lib;
  };
  static std::string canonical(const char* name) {
    std::string s(name);
    if (s.rfind("aten::", 0) == 0) s.erase(0, 6);
    return s;
  }
  static std::unique_ptr<torch::Library> library(const char* file, unsigned line) {
    return std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                            c10::DispatchKey::PrivateUse1, file, line);
  }
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<torch::Library>> sdk_;
  std::map<std::string, Where> vendor_;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
