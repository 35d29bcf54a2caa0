// accelkit: a vendor's per-tensor metadata (Note [Backend metadata]):
// named string fields on a tensor of the backend (backend_meta,
// set_backend_meta, erase_backend_meta, copy_backend_meta for a vendor's
// own kernels), kept by torch.save/torch.load through PyTorch's
// serialization hook for PrivateUse1 and by clone through the SDK's clone
// kernel.
#pragma once

#include <accelkit/diagnostics.hpp>
#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/kernel_table.hpp>

#include <ATen/ops/clone_native.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Backend metadata]
// Problem: a vendor keeps facts about a tensor that PyTorch does not know (a
// private memory layout, as torch_npu's NZ format, a compression, a
// placement). PyTorch gives every TensorImpl one slot for them
// (c10::BackendMeta, which its shallow copies take through
// BackendMeta::clone) and PrivateUse1 one pair of serialization functions
// (torch::jit::TensorBackendMetaRegistry) that write them into, and read
// them from, the dict[str, bool] torch.save keeps beside a tensor's conj and
// neg bits. Nothing else carries them: clone, views and every other
// operator's result start without.
// Decision: the SDK owns the slot and the hook. A tensor's metadata is a map
// of named fields (letters, digits, underscores) to string values,
// immutable: set_backend_meta and erase_backend_meta install a new map, so
// tensors that share one (a tensor and its detach()) never see each other's
// later changes. It is carried
// - by torch.save/torch.load: each field is saved as the key
//   "<backend>.<field>=<value>" (value true) and restored when the tensor
//   is loaded onto a device of the backend (any index, map_location
//   included);
// - by PyTorch's shallow copies: detach(), .data, nn.Parameter(t);
// - by clone (any memory_format): the SDK's clone kernel is PyTorch's
//   composite (empty_like and copy_) followed by copy_backend_meta, which
//   takes any c10::BackendMeta as a shallow copy does; a vendor's own clone
//   kernel calls copy_backend_meta itself;
// - by in-place operators, resize_ and set_, which keep the tensor.
// copy_ (and load_state_dict, which copies into the module's tensors) keeps
// the destination's metadata, as it keeps its dtype and strides.
// Limits: not carried by views (x[0], view, t(): new tensors over the same
// memory), out-of-place results (x + 1, x.to(dtype), x.to(another device),
// x.cpu()), copy.deepcopy (PyTorch rebuilds the tensor over a copied
// storage), torch.load onto the CPU (PyTorch passes the keys to no hook
// there and drops them), sharing between processes and DLPack. Setting a
// tensor's metadata changes the tensor, as resize_ does: not while another
// thread uses that tensor (PyTorch's slot is a plain pointer); reading it
// from many threads is safe. PyTorch takes one hook per device type: the
// SDK registers it when the backend loads, so a vendor uses these functions
// and not TensorBackendMetaRegistry (a hook registered before the SDK's is
// kept, reported through Note [Diagnostics], and the SDK's fields are then
// not saved). The field functions refuse a tensor whose slot other code
// filled (RuntimeError) rather than replace what it keeps there.
class BackendMetaFields final : public c10::BackendMeta {
 public:
  using Map = std::map<std::string, std::string, std::less<>>;
  explicit BackendMetaFields(Map fields) : fields_(std::move(fields)) {}
  const Map& fields() const noexcept { return fields_; }
  // Immutable: a shallow copy shares it.
  c10::intrusive_ptr<c10::BackendMeta> clone(
      const c10::intrusive_ptr<c10::BackendMeta>& self) const override {
    return self;
  }

 private:
  Map fields_;
};

namespace detail_meta {

inline void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined() && t.device().type() == kDeviceType, backend_name(), ": ", what,
                    ": expected a tensor of ", backend_name(), ", got ",
                    t.defined() ? t.device().str() : std::string("an undefined tensor"));
}

inline void check_field(std::string_view field, const char* what) {
  bool ok = !field.empty();
  for (char c : field)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_');
  TORCH_CHECK_VALUE(ok, backend_name(), ": ", what,
                    ": a metadata field is a non-empty name of letters, digits and "
                    "underscores, got '",
                    field, "'");
}

// The tensor's fields (nullptr: none); a slot filled by anything else than
// the SDK is refused.
inline const BackendMetaFields* fields_of(const at::Tensor& t, const char* what) {
  c10::BackendMeta* meta = t.unsafeGetTensorImpl()->get_backend_meta();
  if (!meta) return nullptr;
  auto* fields = dynamic_cast<const BackendMetaFields*>(meta);
  TORCH_CHECK(fields, backend_name(), ": ", what,
              ": the tensor holds backend metadata that was not set through accelkit");
  return fields;
}

inline void install(const at::Tensor& t, BackendMetaFields::Map map) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (map.empty()) {
    if (impl->get_backend_meta()) impl->set_backend_meta(nullptr);
    return;
  }
  impl->set_backend_meta(c10::make_intrusive<BackendMetaFields>(std::move(map)));
}

inline std::string key_prefix() { return std::string(backend_name()) + "."; }

}  // namespace detail_meta

// The value of `field` on tensor `t` of the backend (nullopt: not set).
inline std::optional<std::string> backend_meta(const at::Tensor& t, std::string_view field) {
  detail_meta::check_tensor(t, "backend_meta");
  detail_meta::check_field(field, "backend_meta");
  const BackendMetaFields* f = detail_meta::fields_of(t, "backend_meta");
  if (!f) return std::nullopt;
  auto it = f->fields().find(field);
  if (it == f->fields().end()) return std::nullopt;
  return it->second;
}

// Every field of `t` (empty: none).
inline std::map<std::string, std::string> backend_meta(const at::Tensor& t) {
  detail_meta::check_tensor(t, "backend_meta");
  const BackendMetaFields* f = detail_meta::fields_of(t, "backend_meta");
  if (!f) return {};
  return {f->fields().begin(), f->fields().end()};
}

// Sets `field` of `t` to `value` (any string).
inline void set_backend_meta(const at::Tensor& t, std::string_view field, std::string_view value) {
  detail_meta::check_tensor(t, "set_backend_meta");
  detail_meta::check_field(field, "set_backend_meta");
  const BackendMetaFields* f = detail_meta::fields_of(t, "set_backend_meta");
  BackendMetaFields::Map map = f ? f->fields() : BackendMetaFields::Map{};
  map.insert_or_assign(std::string(field), std::string(value));
  detail_meta::install(t, std::move(map));
}

// Removes `field` from `t` (nothing if it is not set).
inline void erase_backend_meta(const at::Tensor& t, std::string_view field) {
  detail_meta::check_tensor(t, "erase_backend_meta");
  detail_meta::check_field(field, "erase_backend_meta");
  const BackendMetaFields* f = detail_meta::fields_of(t, "erase_backend_meta");
  if (!f || f->fields().find(field) == f->fields().end()) return;
  BackendMetaFields::Map map = f->fields();
  map.erase(map.find(field));
  detail_meta::install(t, std::move(map));
}

// `to` takes the metadata of `from` (none if `from` has none), through
// BackendMeta::clone as PyTorch's shallow copies take it: for a vendor's
// kernel that makes a tensor standing for another, as clone.
inline void copy_backend_meta(const at::Tensor& from, const at::Tensor& to) {
  detail_meta::check_tensor(from, "copy_backend_meta");
  detail_meta::check_tensor(to, "copy_backend_meta");
  c10::intrusive_ptr<c10::BackendMeta> meta =
      from.unsafeGetTensorImpl()->get_backend_meta_intrusive_ptr();
  to.unsafeGetTensorImpl()->set_backend_meta(meta ? meta->clone(meta) : nullptr);
}

// PyTorch's serialization hook for PrivateUse1 (Note [Backend metadata]):
// registered once, when the backend loads.
inline void register_backend_meta_serialization() {
  auto& hooks = torch::jit::GetBackendMetaSerialization();
  if (hooks[static_cast<int>(kDeviceType)].has_value()) {
    report(Severity::warning, backend_name(),
           "a serialization hook for PrivateUse1's backend metadata was registered before "
           "accelkit's: the tensors' accelkit metadata is not saved by torch.save");
    return;
  }
  auto save = [](const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
    c10::BackendMeta* meta = t.unsafeGetTensorImpl()->get_backend_meta();
    auto* f = dynamic_cast<const BackendMetaFields*>(meta);
    if (!f) return;
    std::string prefix = detail_meta::key_prefix();
    for (const auto& [field, value] : f->fields()) metadata[prefix + field + "=" + value] = true;
  };
  auto load = [](const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
    std::string prefix = detail_meta::key_prefix();
    BackendMetaFields::Map map;
    for (const auto& [key, set] : metadata) {
      if (!set || key.compare(0, prefix.size(), prefix) != 0) continue;
      std::size_t eq = key.find('=', prefix.size());
      TORCH_CHECK_VALUE(eq != std::string::npos, backend_name(),
                        ": torch.load: malformed backend metadata key '", key, "'");
      std::string field = key.substr(prefix.size(), eq - prefix.size());
      detail_meta::check_field(field, "torch.load");
      map.insert_or_assign(std::move(field), key.substr(eq + 1));
    }
    if (map.empty()) return;
    detail_meta::fields_of(t, "torch.load");
    detail_meta::install(t, std::move(map));
  };
  torch::jit::TensorBackendMetaRegistry(kDeviceType, save, load);
}

// The SDK's clone kernel: PyTorch's composite, then the metadata (Note
// [Backend metadata]).
inline at::Tensor clone_keeping_meta(const at::Tensor& self,
                                     std::optional<c10::MemoryFormat> memory_format) {
  at::Tensor out = at::native::clone(self, memory_format);
  if (self.unsafeGetTensorImpl()->get_backend_meta()) copy_backend_meta(self, out);
  return out;
}

inline void register_backend_meta_ops(KernelTable& m) {
  m.impl("clone", TORCH_FN(clone_keeping_meta));
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
