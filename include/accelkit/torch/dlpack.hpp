// accelkit: DLPack with the capability schema's device types. The device a
// tensor's memory has in DLPack's terms, the schema's device written into a
// capsule PyTorch made, and the import of a capsule of the backend's own
// type; the operators torch.ops.<name>.dlpack_* that python/accelkit/_dlpack.py
// calls from Tensor.__dlpack__, Tensor.__dlpack_device__ and from_dlpack.
//
// Note [DLPack through the schema]
// Problem: PyTorch's DLPack code knows a PrivateUse1 device only as kDLExtDev
// (at::toDLPack, at::fromDLPack), and its Python side only under the name
// "privateuse1" (Tensor.__dlpack_device__ and torch.from_dlpack fail for a
// renamed device type); a vendor's own type such as kDLOpenCL maps to a
// PyTorch device type nothing implements, and every pinned CPU tensor is
// said to be kDLCUDAHost, whoever pinned it.
// Decision: the schema names the types (Note [DLPack device types] in
// properties.hpp). Export keeps PyTorch's capsule (at::toDLPack or
// at::toDLPackVersioned through torch._C, so its destructor, its versioned
// flags and its stride normalization stay PyTorch's) and then writes the
// schema's device into it (set_export_device): dlpack_device_type and the
// tensor's device index for device memory, dlpack_pinned_device_type and 0
// for a CPU tensor in memory the backend pinned. A capsule of the backend's
// device type, or of its pinned type where that is not kDLCPU, is imported
// here (import_capsule) onto the device it names (IndexError for an index
// that is not visible): a tensor over the producer's memory at
// data + byte_offset whose storage calls the producer's deleter once, when
// it dies. The Python side marks the capsule used only after the import
// returned, so an import that fails leaves the deleter to the capsule's own
// destructor: once either way.
// Limits: kDLExtDev names every vendor's device, so a backend that reports
// it takes any kDLExtDev capsule as its own device's memory, as PyTorch
// does; imported memory is not the caching allocator's (as PyTorch's import
// of CUDA memory). Read-only capsules are refused (PyTorch's tensors are
// writable). Consumers that read PyTorch's C exchange API
// (Tensor.__dlpack_c_exchange_api__) instead of calling __dlpack__ see
// PyTorch's kDLExtDev.
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/errors.hpp>

#include <ATen/DLConvertor.h>
#include <ATen/dlpack.h>

#include <algorithm>
#include <cstdint>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct DLPackOps {
  // The schema's device type of device `d`'s memory.
  static DLDeviceType device_type(device_index d) {
    return translated([&] {
      return static_cast<DLDeviceType>(backend().properties(d).dlpack_device_type);
    });
  }

  // The schema's type of the host memory the backend pins: the first
  // visible device's (kDLCPU without devices, where nothing is pinned).
  static DLDeviceType pinned_type() {
    return translated([&] {
      BackendInterface& b = backend();
      if (b.device_count() == 0) return kDLCPU;
      return static_cast<DLDeviceType>(b.properties(0).dlpack_pinned_device_type);
    });
  }

  // Whether a CPU tensor's memory is the backend's pinned memory (as
  // Tensor.is_pinned asks PyTorch's hooks: the storage's start).
  static bool pinned_by_backend(const at::Tensor& t) {
    if (!t.device().is_cpu() || !t.has_storage()) return false;
    const void* p = t.storage().data();
    BackendInterface& b = backend();
    return p && b.is_initialized() && b.host_is_allocation(p);
  }

  // Where a tensor's memory is, in DLPack's terms, from the schema: the
  // backend's device type and index, the pinned type for a CPU tensor the
  // backend pinned, kDLCPU for other CPU tensors, and PyTorch's answer for
  // other devices.
  static DLDevice device_of(const at::Tensor& t) {
    if (t.device().type() == kDeviceType) {
      auto d = static_cast<device_index>(t.device().index());
      return DLDevice{device_type(d), static_cast<int32_t>(d)};
    }
    if (t.device().is_cpu())
      return DLDevice{pinned_by_backend(t) ? pinned_type() : kDLCPU, 0};
    return at::torchDeviceToDLDevice(t.device());
  }

  // Writes the schema's device of `t` into the capsule's tensor at
  // `address` (a DLManagedTensor, or a DLManagedTensorVersioned where
  // `versioned`) that PyTorch made from `t`, and DLPack's is-copied flag
  // where `copied` (the export copied the producer's tensor).
  static void set_export_device(int64_t address, bool versioned, const at::Tensor& t, bool copied) {
    TORCH_CHECK_VALUE(address != 0, backend_name(), ": no DLPack tensor at address 0");
    DLTensor& dl = versioned ? reinterpret_cast<DLManagedTensorVersioned*>(address)->dl_tensor
                             : reinterpret_cast<DLManagedTensor*>(address)->dl_tensor;
    TORCH_CHECK_VALUE(dl.data == t.data_ptr(), backend_name(),
                      ": the DLPack tensor at ", reinterpret_cast<void*>(address),
                      " is not the export of the given tensor (its data is at ", dl.data,
                      ", the tensor's at ", t.data_ptr(), ")");
    dl.device = device_of(t);
    if (versioned && copied)
      reinterpret_cast<DLManagedTensorVersioned*>(address)->flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
  }

  // A tensor over the memory of the capsule's tensor at `address`, on the
  // device its DLDevice names (Note [DLPack through the schema]).
  static at::Tensor import_capsule(int64_t address, bool versioned) {
    TORCH_CHECK_VALUE(address != 0, backend_name(), ": no DLPack tensor at address 0");
    if (!versioned) return import_managed(reinterpret_cast<DLManagedTensor*>(address), 0);
    auto* m = reinterpret_cast<DLManagedTensorVersioned*>(address);
    TORCH_CHECK(m->version.major == DLPACK_MAJOR_VERSION, backend_name(),
                ": a DLPack tensor of version ", m->version.major, ".", m->version.minor,
                " cannot be imported (this build reads major version ", DLPACK_MAJOR_VERSION, ")");
    return import_managed(m, m->flags);
  }

 private:
  // The device of an imported tensor: the backend's device the DLDevice
  // names (IndexError for one not visible), or the CPU for pinned memory.
  static c10::Device import_device(const DLDevice& device) {
    bool device_kind = false;
    for (int d = 0, n = backend().device_count(); d < n; ++d)
      device_kind = device_kind || device.device_type == device_type(d);
    if (device_kind) {
      translated([&] { backend().check_visible(device.device_id); });
      DLDeviceType own = device_type(device.device_id);
      TORCH_CHECK_VALUE(own == device.device_type, backend_name(), ": DLPack device (",
                        static_cast<int>(device.device_type), ", ", device.device_id,
                        ") is not ", backend_name(), ":", device.device_id, ", whose type is ",
                        static_cast<int>(own));
      return c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(device.device_id));
    }
    DLDeviceType pinned = pinned_type();
    TORCH_CHECK_VALUE(pinned != kDLCPU && device.device_type == pinned, backend_name(),
                      ": DLPack device type ", static_cast<int>(device.device_type),
                      " is neither the type of a ", backend_name(),
                      " device nor of the host memory it pins");
    return c10::Device(c10::kCPU);
  }

  template <class M>
  static at::Tensor import_managed(M* m, uint64_t flags) {
    const DLTensor& dl = m->dl_tensor;
    TORCH_CHECK(!(flags & DLPACK_FLAG_BITMASK_READ_ONLY), backend_name(),
                ": a read-only DLPack tensor cannot be imported (PyTorch's tensors are writable)");
    c10::Device device = import_device(dl.device);
    at::ScalarType dtype = at::toScalarType(dl.dtype);
    TORCH_CHECK_VALUE(dl.ndim >= 0, backend_name(), ": DLPack tensor with ndim ", dl.ndim);
    std::vector<int64_t> sizes(dl.shape, dl.shape + dl.ndim);
    std::vector<int64_t> strides;
    if (dl.strides) {
      strides.assign(dl.strides, dl.strides + dl.ndim);
    } else {  // compact, row-major
      strides.resize(sizes.size());
      int64_t stride = 1;
      for (std::size_t i = sizes.size(); i-- > 0;) {
        strides[i] = stride;
        stride *= std::max<int64_t>(sizes[i], 1);
      }
    }
    void* data = dl.data ? static_cast<char*>(dl.data) + dl.byte_offset : nullptr;
    return at::from_blob(
        data, sizes, strides,
        [m](void*) {
          if (m->deleter) m->deleter(m);
        },
        at::TensorOptions().device(device).dtype(dtype), device);
  }
};

// torch.ops.<name>.dlpack_*, for python/accelkit/_dlpack.py.
inline void register_dlpack_ops(torch::Library& lib) {
  // [device type, index] of a tensor's memory (Tensor.__dlpack_device__).
  lib.def("dlpack_device(Tensor t) -> int[]", [](const at::Tensor& t) {
    DLDevice d = DLPackOps::device_of(t);
    return std::vector<int64_t>{static_cast<int64_t>(d.device_type), d.device_id};
  });
  // The schema's device types: of every visible device, then of pinned
  // memory.
  lib.def("dlpack_device_types() -> int[]", [] {
    std::vector<int64_t> out;
    int n = backend().device_count();
    for (int d = 0; d < n; ++d) out.push_back(DLPackOps::device_type(d));
    out.push_back(DLPackOps::pinned_type());
    return out;
  });
  lib.def("dlpack_set_export_device(int address, bool versioned, Tensor t, bool copied) -> ()",
          [](int64_t address, bool versioned, const at::Tensor& t, bool copied) {
            DLPackOps::set_export_device(address, versioned, t, copied);
          });
  lib.def("dlpack_import(int address, bool versioned) -> Tensor",
          [](int64_t address, bool versioned) {
            return DLPackOps::import_capsule(address, versioned);
          });
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
