// accelkit: the CPU fallback, which runs every operator without a native
// kernel through PyTorch's CPU kernel (Fallback and fallback): its
// policy, block list and report (Note [CPU fallback policy]), the CPU kernel
// on device memory or on copies in the same layouts (Notes [Zero-copy
// fallback] and [Layout-keeping fallback]) and with the same aliasing
// (HostImage, Note [One host storage per device storage]), the one-device
// check, and the devices' generators (Note [Device generators]).
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/host_access.hpp>
#include <accelkit/torch/python_lock.hpp>
#include <accelkit/torch/sparse.hpp>
#include <accelkit/torch/storage.hpp>

#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Tensors of two devices in one operator, refused in PyTorch's own words
// (a RuntimeError naming both devices and the operator).
inline void check_same_device(const c10::Device& first, const c10::Device& other,
                              const std::string& op) {
  TORCH_CHECK(first == other,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              first, " and ", other, "! (in ", op, ")");
}

// Note [One host storage per device storage]
// PyTorch's CPU kernels refuse an out= tensor that partly overlaps an input,
// or whose own elements overlap (an expanded tensor), and let a full overlap
// through (torch.add(a, b, out=a), x.mul_(x)): at::assert_no_partial_overlap,
// assert_no_overlap and assert_no_internal_overlap (ATen/MemoryOverlap.h)
// compare the tensors' storages, addresses and strides. A CPU tensor made
// for each device tensor on its own would hide every overlap from them, and
// the kernel would then write through one tensor what it reads through the
// other (garbage on shared memory, copy semantics on copies).
// So the fallback gives the CPU kernel the device tensors' aliasing as it
// is: each device storage the operator's tensors use becomes one CPU
// storage, and each tensor a CPU tensor over it with the device tensor's
// own storage offset, sizes, strides and dtype (one tensor passed twice is
// one CPU tensor). The CPU kernel sees what it would see on the CPU, and
// refuses, with its own message, or allows exactly what the CPU does,
// whatever the memory mode.
// - Host-visible memory (direct or mapped): the CPU storage is the device
//   storage's memory, from its base, with its byte size, at the host's
//   address of it (HostAccess::host_ptr: a mapped device's driver may map
//   it elsewhere than the device pointer).
// - Copies (host_access none): the CPU storage is new host memory, as large
//   as the device storage, of which only the bytes the tensors span (each
//   tensor's first element to its last, the spans merged) are copied in, at
//   the same offsets; afterwards what the written tensors span is copied
//   back. The memory is reserved, not touched, beyond those spans.
// - Either way, a CPU storage the kernel moved to new memory (it resized an
//   out= tensor past the storage's end) makes the device storage grow to
//   that size, keeping its contents, and take what the written tensors
//   span: every tensor of the storage, in the operator or not, sees the new
//   memory, as every tensor of the CPU storage does on the CPU.
// Limits: two device storages over the same memory (from_blob) are two CPU
// storages, which PyTorch's checks take as disjoint, as they would on the
// CPU. Copies: what a written tensor spans after the kernel is copied back
// whole, so bytes of that span that the kernel did not write and that no
// tensor spanned before (gaps of a tensor the kernel restrided onto new
// bytes) take the host memory's contents.
class HostImage {
 public:
  explicit HostImage(bool visible) : visible_(visible) {}

  // Records a device tensor of the operator (before any view()).
  void add(const at::Tensor& t) {
    Storage& s = storage_of(t);
    if (s.first != t.unsafeGetTensorImpl()) shared_ = true;
    if (t.numel() > 0) s.spans.push_back(span(t));
  }
  // Whether two distinct tensors of the operator share a device storage.
  bool shared() const { return shared_; }

  // Makes the CPU storages (copies: and copies the spans in) of the device
  // storages recorded since the last load.
  void load(device_index d) {
    d_ = d;
    for (Storage& s : storages_) {
      if (s.loaded) continue;
      s.loaded = true;
      std::size_t n = s.device.nbytes();
      // Visible: the host's address of the device memory (mapped: where
      // its open map put it).
      c10::DataPtr data =
          visible_ ? c10::DataPtr(n == 0 ? nullptr
                                         : translated([&] {
                                             return HostAccess::host_ptr(d, s.device.mutable_data());
                                           }),
                                  c10::Device(c10::kCPU))
                   : c10::GetCPUAllocator()->allocate(n);
      s.host = c10::Storage(c10::Storage::use_byte_size_t(), n, std::move(data),
                            c10::GetCPUAllocator(), s.device.resizable());
      s.host_data = s.host.data();
      if (visible_) continue;
      for (auto [begin, end] : merged(std::move(s.spans)))
        copy(static_cast<char*>(s.host.mutable_data()) + begin,
             static_cast<const char*>(s.device.data()) + begin, end - begin,
             CopyKind::device_to_host);
    }
    if (copied_) finish();
  }

  // The CPU tensor of device tensor t (recorded with add()).
  at::Tensor view(const at::Tensor& t) {
    at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(storage_of(t).host), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    v.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    return v;
  }

  // The device storage whose CPU storage `host` (a CPU tensor after the
  // kernel) is on, or nullptr.
  const c10::Storage* device_storage(const at::Tensor& host) const {
    if (!host.has_storage()) return nullptr;
    for (const Storage& s : storages_)
      if (s.host.unsafeGetStorageImpl() == host.storage().unsafeGetStorageImpl()) return &s.device;
    return nullptr;
  }

  // After the kernel: each device storage takes what the written tensors
  // (their CPU tensors, as the kernel left them) span where the device does
  // not hold it already, growing first if the kernel moved its CPU storage.
  void store(const std::vector<at::Tensor>& written) {
    for (Storage& s : storages_) {
      bool moved = s.host.data() != s.host_data || s.host.nbytes() != s.device.nbytes();
      if (visible_ && !moved) continue;  // the kernel wrote device memory
      std::vector<std::pair<std::size_t, std::size_t>> spans;
      for (const at::Tensor& h : written)
        if (h.numel() > 0 && h.has_storage() &&
            h.storage().unsafeGetStorageImpl() == s.host.unsafeGetStorageImpl())
          spans.push_back(span(h));
      if (moved) translated([&] { StorageOps::grow_storage(s.device, s.host.nbytes()); });
      for (auto [begin, end] : merged(std::move(spans)))
        copy(static_cast<char*>(s.device.mutable_data()) + begin,
             static_cast<const char*>(s.host.data()) + begin, end - begin,
             CopyKind::host_to_device);
    }
    if (copied_) finish();
  }

 private:
  struct Storage {
    c10::Storage device;
    const c10::TensorImpl* first;  // the first tensor of it recorded
    c10::Storage host;
    const void* host_data = nullptr;  // the memory the kernel was given
    std::vector<std::pair<std::size_t, std::size_t>> spans;  // bytes [begin, end)
    bool loaded = false;
  };

  // An operator has a few storages: a linear search.
  Storage& storage_of(const at::Tensor& t) {
    for (Storage& s : storages_)
      if (s.device.unsafeGetStorageImpl() == t.storage().unsafeGetStorageImpl()) return s;
    return storages_.emplace_back(
        Storage{t.storage(), t.unsafeGetTensorImpl(), {}, nullptr, {}, false});
  }
  // The bytes of its storage from a tensor's first element to its last.
  static std::pair<std::size_t, std::size_t> span(const at::Tensor& t) {
    std::size_t begin = static_cast<std::size_t>(t.storage_offset()) * t.element_size();
    return {begin,
            begin + at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size())};
  }
  static std::vector<std::pair<std::size_t, std::size_t>> merged(
      std::vector<std::pair<std::size_t, std::size_t>> spans) {
    std::sort(spans.begin(), spans.end());
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (auto sp : spans) {
      if (!out.empty() && sp.first <= out.back().second)
        out.back().second = std::max(out.back().second, sp.second);
      else
        out.push_back(sp);
    }
    return out;
  }
  // Queued on d's current stream, from or to pageable host memory; finish()
  // waits for them.
  void copy(void* dst, const void* src, std::size_t n, CopyKind kind) {
    translated([&] {
      backend().memcpy_async(d_, dst, src, n, kind, HostAccess::stream_of(d_),
                                             /*host_pinned=*/false);
    });
    copied_ = true;
  }
  void finish() {
    translated([&] { HostAccess::sync(d_); });
    copied_ = false;
  }

  bool visible_;
  bool shared_ = false;
  device_index d_ = 0;
  bool copied_ = false;
  std::vector<Storage> storages_;  // in the order met
};

// A new CPU result on `device`, in the CPU kernel's layout. .to() would
// compact a result that is not dense (linalg_lstsq returns its solution as a
// slice of a bigger buffer), and a later kernel on another layout may round
// differently (BLAS); such a result keeps its strides.
inline at::Tensor cpu_result_to(const at::Tensor& t, c10::Device device) {
  if (!t.defined()) return t;
  if (t.layout() != c10::kStrided || t.is_non_overlapping_and_dense() ||
      at::has_internal_overlap(t) == at::MemOverlap::Yes)
    return t.to(device);
  at::Tensor out = at::empty_strided(t.sizes(), t.strides(), t.options().device(device));
  out.copy_(t);
  return out;
}

// The CPU tensors of an operator's device tensors over a HostImage (one per
// device tensor: one tensor passed twice is one CPU tensor), and what the
// CPU kernel did to them brought back to the device tensors (Note [One host
// storage per device storage]): the zero-copy fallback's and the host
// kernels' on mapped memory (Note [Host kernels]).
class HostAliases {
 public:
  explicit HostAliases(HostImage& image) : image_(image) {}

  // The CPU tensor of device tensor t (recorded in the image and loaded);
  // any other tensor as it is.
  const at::Tensor& alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kDeviceType) return t;
    for (const Alias& a : aliases_)
      if (a.device_tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return a.host_view;
    at::Tensor view = image_.view(t);
    // Operators that take lazily conjugated or negated inputs as they are
    // (dot, vdot, ...: the Conjugate key falls through for them) read the
    // same bits on the CPU alias (Note [Math bits in copies]).
    view._set_conj(t.is_conj());
    view._set_neg(t.is_neg());
    aliases_.push_back({t, view});
    return aliases_.back().host_view;
  }
  // The device tensor whose CPU tensor `host` is (the same TensorImpl), or
  // nullptr.
  const at::Tensor* device_tensor(const at::Tensor& host) const {
    for (const Alias& a : aliases_)
      if (a.host_view.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return &a.device_tensor;
    return nullptr;
  }

  // After the kernel, its maps closed: the device storages take what the
  // kernel wrote through the CPU tensors of the `written` device tensors
  // (and grow where it moved their CPU storage), and each device tensor
  // takes what the kernel did to its CPU tensor's metadata:
  // - set onto CPU memory of its own: new device memory in the kernel's
  //   layout;
  // - set onto another argument's storage: that device storage;
  // - resized or restrided in place (a (0,) out= tensor resized to
  //   (1, 0, 3), transpose_, as_strided_);
  // - a conjugate or negative bit set in place (linalg_lu_solve with
  //   left=False conjugates its output by setting the bit).
  void store(const std::set<const c10::TensorImpl*>& written) {
    std::vector<at::Tensor> written_views;
    for (const Alias& a : aliases_)
      if (written.count(a.device_tensor.unsafeGetTensorImpl()))
        written_views.push_back(a.host_view);
    image_.store(written_views);
    for (Alias& a : aliases_) {
      const at::Tensor& host = a.host_view;
      at::Tensor& dev = a.device_tensor;
      const c10::Storage* storage = image_.device_storage(host);
      if (!storage) {
        dev.set_(cpu_result_to(host, dev.device()));
      } else if (storage->unsafeGetStorageImpl() != dev.storage().unsafeGetStorageImpl()) {
        dev.set_(*storage, host.storage_offset(), host.sizes(), host.strides());
      } else if (host.sizes() != dev.sizes() || host.strides() != dev.strides() ||
                 host.storage_offset() != dev.storage_offset()) {
        dev.as_strided_(host.sizes(), host.strides(), host.storage_offset());
      }
      if (dev.is_conj() != host.is_conj()) dev._set_conj(host.is_conj());
      if (dev.is_neg() != host.is_neg()) dev._set_neg(host.is_neg());
    }
  }

 private:
  struct Alias {
    at::Tensor device_tensor;
    at::Tensor host_view;
  };
  HostImage& image_;
  std::deque<Alias> aliases_;  // references to its views stay valid
};

// Note [CPU fallback policy]: every operator without a native kernel runs on
// the CPU (inputs copied there, outputs copied back). <NAME>_FALLBACK
// chooses what happens: "allow" (default), "warn" (a warning the first time
// each operator falls back) or "error"; <NAME>_FALLBACK_BLOCKLIST names
// operators (comma list) that must not fall back. The report lists each
// operator that fell back, how often and for how long.
class Fallback {
  struct Entry;

 public:
  enum class Policy { allow, warn, error };
  static Fallback& get() {
    static Fallback* const f = new Fallback();
    return *f;
  }

  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    Entry& e = admit(op);
    std::optional<c10::Device> to_device = check_one_device(op, *stack, e.name);
    refuse_during_capture(op, *stack, to_device, e.name);  // Note [Refusals during capture]
    GeneratorLease generator(op, *stack);  // Note [Device generators]
    auto t0 = std::chrono::steady_clock::now();
    if (!on_cpu(op, *stack)) {
      at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
      if (to_device) results_to(op, *stack, *to_device);
    }
    std::size_t results = op.schema().returns().size();
    for (std::size_t i = stack->size() - results; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != c10::kStrided &&
          v.toTensor().device().type() == kDeviceType)
        refuse_sparse(op);  // Note [Sparse layouts]
    }
    e.add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
              .count());
  }

  // Refuses the operator when the current stream of a device its tensors
  // (or its results) are on is capturing (Note [Refusals during capture]).
  static void refuse_during_capture(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                    const std::optional<c10::Device>& to_device,
                                    const std::string& name) {
    auto what = [&] {
      return fmt::format("{} (the CPU fallback: PyTorch's CPU kernel on the device's memory, "
                         "run by the host)",
                         name);
    };
    auto check = [&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kDeviceType)
        refuse_if_capturing(t.device().index(), what);
    };
    std::size_t first = stack.size() - op.schema().arguments().size();
    for (std::size_t i = first; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensor()) {
        check(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) check(t);
      } else if (v.isOptionalTensorList()) {
        for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
          if (t) check(*t);
      }
    }
    if (to_device && to_device->type() == kDeviceType)
      refuse_if_capturing(to_device->has_index() ? to_device->index() : backend().current_device(),
                          what);
  }

  // Counts one run of an operator through the CPU in the report, timed
  // until it is destroyed.
  class Count {
   public:
    explicit Count(Entry& e) : e_(e) {}
    ~Count() {
      e_.add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
                 .count());
    }
    Count(const Count&) = delete;
    Count& operator=(const Count&) = delete;

   private:
    Entry& e_;
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  };
  // A run through the CPU of operator `op` (by name) that does not come
  // through the dispatcher's fallback, under the same policy and block list.
  Count run_named(const std::string& op) { return Count(admit(entry_named(op))); }

  // Runs body() as operator `op` through the CPU under the policy, counted
  // in the report: the host kernels' way in (Note [Host kernels]).
  template <class F>
  decltype(auto) host(const c10::OperatorHandle& op, F&& body) {
    Count count(admit(op));
    return body();
  }

  // "op count total_ms" lines, most time first.
  std::string report() {
    std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> v;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [name, e] : stats_)
        if (auto c = e->count.load()) v.emplace_back(e->ns.load(), c, name);
    }
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return std::get<0>(a) > std::get<0>(b); });
    std::ostringstream out;
    for (auto& [ns, count, name] : v) out << name << ' ' << count << ' ' << (ns / 1e6) << '\n';
    return out.str();
  }
  // Zeroes the counts (entries stay: threads cache them).
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [name, e] : stats_) {
      e->count = 0;
      e->ns = 0;
    }
  }

 private:
  struct Entry {
    std::string name;  // "aten::add.out"
    bool blocked = false;
    std::atomic<std::int64_t> count{0};
    std::atomic<std::int64_t> ns{0};
    std::atomic<bool> warned{false};
    void add(std::int64_t elapsed) {
      // The operator's kernel ran on device data (Note [Device work of an
      // operator]).
      note_device_work();
      count.fetch_add(1, std::memory_order_relaxed);
      ns.fetch_add(elapsed, std::memory_order_relaxed);
    }
  };

  Entry& entry_named(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Entry>& slot = stats_[name];
    if (!slot) {
      slot = std::make_unique<Entry>();
      slot->name = name;
      std::string base = name.substr(0, name.find('.'));
      slot->blocked = blocked_.count(name) != 0 || blocked_.count(base) != 0;
    }
    return *slot;
  }

  // The entry of an operator, cached per thread (the dispatcher's schema
  // objects live as long as the process).
  Entry& entry_for(const c10::OperatorHandle& op) {
    static thread_local const void* last_schema = nullptr;
    static thread_local Entry* last = nullptr;
    const void* schema = &op.schema();
    if (schema == last_schema) return *last;
    Entry* e;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = by_schema_.find(schema);
      e = it == by_schema_.end() ? nullptr : it->second;
    }
    if (!e) {
      const c10::OperatorName& n = op.schema().operator_name();
      e = &entry_named(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
      std::lock_guard<std::mutex> lock(mutex_);
      by_schema_.emplace(schema, e);
    }
    last_schema = schema;
    last = e;
    return *e;
  }

  static std::string upper() { return detail::upper(backend_name()); }

  // The entry of `op`, once the policy and the block list let it through
  // the CPU (warning once per operator under the warn policy).
  Entry& admit(const c10::OperatorHandle& op) { return admit(entry_for(op)); }
  Entry& admit(Entry& e) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        policy_ != Policy::error && !e.blocked, "The operator '", e.name,
        "' is not implemented for ", backend_name(), " and its CPU fallback is ",
        policy_ == Policy::error ? "disabled (" : "blocked (", upper(), "_FALLBACK",
        policy_ == Policy::error ? "=error)" : "_BLOCKLIST)");
    if (policy_ == Policy::warn && !e.warned.exchange(true, std::memory_order_relaxed))
      TORCH_WARN("The operator '", e.name, "' is not implemented for ", backend_name(),
                 " and falls back to the CPU; this may be slow.");
    return e;
  }

  // Note [Zero-copy fallback]: when the host can reach the device's memory
  // (host_access mapped or direct; mapped memory is mapped for the kernel's
  // length: Note [Map scopes]), the CPU kernel runs directly on device memory: the
  // current stream is synchronized (the kernel then runs, in effect, at its
  // place on that stream), every device tensor argument is replaced by a CPU
  // tensor viewing the same memory, at the host's address of it (a mapped
  // device's: where host_map put it), one CPU storage per device storage
  // (Note [One host storage per device storage]), and results that are those
  // views are mapped back to the device tensors. A new result (a functional
  // operator's output) is copied to the device in the layout the kernel
  // gave it.
  //
  // Note [Layout-keeping fallback]: without host-visible memory the same
  // path runs on copies: the bytes each device tensor argument spans, from
  // its first element to its last, are copied to the CPU at their offsets in
  // a CPU storage standing for the device storage, and the tensor viewed
  // there with its own strides, offset and math bits; what the arguments
  // the operator writes span is copied back afterwards. The CPU kernel thus
  // sees exactly the layouts, and the aliasing, it would see on the CPU (a
  // conjugate view stays one, a transposed slice stays one, an out= over
  // its input stays one), and computes bit for bit as there; a copy that
  // resolved them would let BLAS round differently. When no two arguments
  // share a device storage, arguments that view less than a quarter of a
  // range above 1 MiB take the compacting copy of at::native::cpu_fallback
  // instead, as do operators with no device tensor, or with tensors of
  // other devices or device types.
  bool on_cpu(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    // A result that aliases an input (a view) cannot be mapped back; such
    // operators take at::native::cpu_fallback, which refuses them clearly.
    for (const c10::Argument& r : op.schema().returns())
      if (r.alias_info() && !r.alias_info()->isWrite()) return false;
    const auto& arguments = op.schema().arguments();
    std::size_t first = stack.size() - arguments.size();
    std::optional<c10::Device> device;
    // f(tensor) for each tensor argument, in lists too (an optional-tensor
    // list's absent entries skipped), until f says no.
    auto each_tensor = [&](auto&& f) {
      for (std::size_t i = first; i < stack.size(); ++i) {
        const c10::IValue& v = stack[i];
        if (v.isTensor()) {
          if (!f(v.toTensor())) return false;
        } else if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorVector())
            if (!f(t)) return false;
        } else if (v.isOptionalTensorList()) {  // index, index_put_
          for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
            if (t && !f(*t)) return false;
        } else if (v.isList()) {  // sizes, dims, scalars: as they are
          for (const c10::IValue& e : v.toListRef())
            if (e.isTensor()) return false;  // tensors in another kind of list: copying path
        } else if (v.isDevice()) {
          return false;  // the operator says where its results go: copying path
        }
      }
      return true;
    };
    if (!each_tensor([&](const at::Tensor& t) {
          if (!t.defined() || t.device().type() != kDeviceType) return true;
          if (!device) device = t.device();
          return t.layout() == c10::kStrided && *device == t.device();
        }) ||
        !device)
      return false;
    device_index d = device->index();
    // Mapped memory is mapped for the CPU kernel's length (Note [Map scopes]).
    std::optional<MapScope> maps;
    bool visible = translated([&] { return HostAccess::host_reachable_ready(d); });
    // The device tensors by storage (Note [One host storage per device storage]).
    HostImage image(visible);
    each_tensor([&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kDeviceType) image.add(t);
      return true;
    });
    if (visible) {
      // Every storage the operator touches, largest first (Note [Map scopes]);
      // a tensor without elements too, which the kernel may resize within
      // its storage.
      maps.emplace(d);
      std::vector<at::Tensor> touched;
      each_tensor([&](const at::Tensor& t) {
        if (t.defined() && t.device().type() == kDeviceType && t.storage().nbytes() > 0)
          touched.push_back(t);
        return true;
      });
      translated([&] { maps->add_all(touched); });
    } else if (!image.shared() && !each_tensor([&](const at::Tensor& t) {
                 if (!t.defined() || t.device().type() != kDeviceType || t.numel() == 0)
                   return true;
                 std::size_t extent = at::detail::computeStorageNbytes(t.sizes(), t.strides(),
                                                                       t.element_size());
                 return extent <= std::max<std::size_t>(4 * t.nbytes(), std::size_t{1} << 20);
               })) {
      return false;
    }
    image.load(d);

    // The tensors the operator writes (out= and in-place arguments).
    std::set<const c10::TensorImpl*> written;
    for (std::size_t i = first; i < stack.size(); ++i) {
      const c10::AliasInfo* info = arguments[i - first].alias_info();
      if (!info || !info->isWrite()) continue;
      if (stack[i].isTensor()) written.insert(stack[i].toTensor().unsafeGetTensorImpl());
      if (stack[i].isTensorList())
        for (const at::Tensor& t : stack[i].toTensorVector()) written.insert(t.unsafeGetTensorImpl());
    }
    HostAliases aliases(image);
    auto alias_of = [&](const at::Tensor& t) -> at::Tensor { return aliases.alias(t); };
    for (std::size_t i = first; i < stack.size(); ++i) {
      c10::IValue& v = stack[i];
      if (v.isTensor()) {
        v = alias_of(v.toTensor());
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorVector()) list.push_back(alias_of(t));
        v = c10::IValue(list);
      } else if (v.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> list;
        for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
          list.push_back(t ? std::optional<at::Tensor>(alias_of(*t)) : std::nullopt);
        v = c10::IValue(list);
      }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    // The results below touch device memory through copies only; a failed
    // unmap fails the operator (Note [Map scopes]).
    if (maps) maps->close();
    maps.reset();

    // Each result: the device tensor of its CPU view, or a new tensor on the
    // device (in lists too: histogramdd's bin edges).
    auto result = [&](const at::Tensor& out) {
      const at::Tensor* same = aliases.device_tensor(out);
      return same ? *same : to_device(out, *device);
    };
    std::size_t results = op.schema().returns().size();
    for (std::size_t i = stack.size() - results; i < stack.size(); ++i) {
      c10::IValue& v = stack[i];
      if (v.isTensor()) {
        v = result(v.toTensor());
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorVector()) list.push_back(result(t));
        v = c10::IValue(list);
      }
    }
    // The device storages take what the kernel wrote, and the device
    // tensors what it did to their CPU tensors (HostAliases::store).
    aliases.store(written);
    return true;
  }

  // Like PyTorch's native kernels, refuse tensors of two devices of this
  // backend in one operator (the CPU fallback would silently mix them), or
  // a device tensor with a CPU tensor that is not a zero-dim scalar.
  // Raises unless the tensor arguments are on at most one device of this
  // backend. Returns that device when at::native::cpu_fallback would put the
  // results elsewhere: it follows the first tensor argument, which may be a
  // CPU scalar (a zero-dim CPU tensor: `2.0 - x` is sub(scalar, x)), while
  // on a device (as with CUDA) the results of such an operator belong on the
  // device. A first argument that is a CPU tensor of any other shape keeps
  // PyTorch's rule (`cpu_x[device_mask]` is a CPU tensor).
  // Note [Device generators] (generator.hpp): a random operator that falls
  // back draws from the generator it is given, or else from its device's
  // default generator (the hooks' getDefaultGenerator), never from the
  // CPU's. A generator of another device type is refused as CUDA refuses
  // one. The CPU kernel checks that its generator is a CPU one, so for the
  // length of the call it gets a CPU generator holding the device
  // generator's state, which goes back to the device generator afterwards,
  // whether the kernel succeeded or not; the device generator's mutex is
  // held meanwhile, so two threads never draw the same numbers.
  class GeneratorLease {
   public:
    GeneratorLease(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
      const auto& args = op.schema().arguments();
      std::size_t first = stack.size() - args.size();
      std::optional<std::size_t> slot;
      std::optional<c10::Device> device;
      for (std::size_t i = 0; i < args.size(); ++i) {
        const c10::IValue& v = stack[first + i];
        if (v.isTensor() && !device && v.toTensor().defined() &&
            v.toTensor().device().type() == kDeviceType)
          device = v.toTensor().device();
        if (slot) continue;
        c10::TypePtr t = args[i].real_type();
        if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
        if (t->kind() == c10::TypeKind::GeneratorType) slot = i;
      }
      if (!slot) return;
      c10::IValue& v = stack[first + *slot];
      if (v.isNone()) {
        if (!device) return;  // no device tensor: the CPU's default, as on the CPU
        device_gen_ = at::globalContext().defaultGenerator(*device);
      } else {
        device_gen_ = v.toGenerator();
        TORCH_CHECK(device_gen_.device().type() == kDeviceType, "Expected a '",
                    c10::DeviceTypeName(kDeviceType, /*lower_case=*/true),
                    "' device type for generator but found '",
                    c10::DeviceTypeName(device_gen_.device().type(), /*lower_case=*/true), "'");
      }
      impl_ = dynamic_cast<DeviceGenerator*>(device_gen_.unsafeGetGeneratorImpl());
      TORCH_CHECK(impl_, backend_name(), ": the generator of ", device_gen_.device(),
                  " was not made by this backend");
      frames_off_.emplace();  // Note [History frames]: no GIL under the generator's mutex
      lock_ = std::unique_lock<std::mutex>(device_gen_.mutex());
      cpu_gen_ = at::make_generator<at::CPUGeneratorImpl>();
      impl_->copy_state_to(*cpu_gen_.get<at::CPUGeneratorImpl>());
      v = c10::IValue(cpu_gen_);
    }
    ~GeneratorLease() {
      if (impl_) impl_->copy_state_from(*cpu_gen_.get<at::CPUGeneratorImpl>());
    }
    GeneratorLease(const GeneratorLease&) = delete;
    GeneratorLease& operator=(const GeneratorLease&) = delete;

   private:
    at::Generator device_gen_, cpu_gen_;
    DeviceGenerator* impl_ = nullptr;
    std::optional<PythonFramesOff> frames_off_;  // while the mutex is held
    std::unique_lock<std::mutex> lock_;  // released after the state went back
  };

  static std::optional<c10::Device> check_one_device(const c10::OperatorHandle& op,
                                                     const torch::jit::Stack& stack,
                                                     const std::string& full) {
    std::size_t n = op.schema().arguments().size();
    std::optional<c10::Device> seen;
    bool cpu_tensor = false;  // a CPU tensor that is not a scalar
    bool cpu_first = false, any = false, device_arg = false;
    // `indices`: an optional-tensor list (index, index_put_), whose CPU
    // index tensors CUDA accepts too.
    auto check = [&](const at::Tensor& t, bool indices) {
      if (!t.defined()) return;
      if (!any) cpu_first = t.device().is_cpu() && t.dim() == 0;
      any = true;
      if (t.device().type() != kDeviceType) {
        if (!indices && t.device().is_cpu() && t.dim() > 0) cpu_tensor = true;
        return;
      }
      if (!seen) seen = t.device();
      check_same_device(*seen, t.device(), full);
    };
    for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensor()) {
        check(v.toTensor(), false);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) check(t, false);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef())
          if (e.isTensor()) check(e.toTensor(), true);
      } else if (v.isDevice()) {
        device_arg = true;  // the operator says where its results go
      }
    }
    // A CPU tensor beside device tensors is refused as on CUDA, unless it
    // is a zero-dim scalar (which TensorIterator takes on any device).
    if (seen && cpu_tensor) check_same_device(*seen, c10::Device(c10::kCPU), full);
    if (seen && cpu_first && !device_arg) return seen;
    return std::nullopt;
  }

  // A new CPU result on `device` (cpu_result_to).
  static at::Tensor to_device(const at::Tensor& t, c10::Device device) {
    return cpu_result_to(t, device);
  }

  static void results_to(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                         c10::Device device) {
    const auto& returns = op.schema().returns();
    std::size_t first = stack.size() - returns.size();
    for (std::size_t i = 0; i < returns.size(); ++i) {
      c10::IValue& v = stack[first + i];
      if (returns[i].alias_info() || !v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.device().is_cpu()) v = to_device(t, device);
    }
  }

  Fallback() {
    const Environment& env = backend().environment();
    if (auto v = env.get(upper() + "_FALLBACK")) {
      std::string_view s = detail::trim(*v);
      if (s == "allow" || s.empty()) policy_ = Policy::allow;
      else if (s == "warn") policy_ = Policy::warn;
      else if (s == "error") policy_ = Policy::error;
      else
        TORCH_CHECK_VALUE(false, backend_name(), ": ", upper(), "_FALLBACK='", *v,
                          "': expected allow, warn or error");
    }
    if (auto v = env.get(upper() + "_FALLBACK_BLOCKLIST")) {
      for (std::string_view item : detail::split_list(*v)) {
        if (item.empty()) continue;
        std::string op(item);
        if (op.rfind("aten::", 0) != 0) op = "aten::" + op;
        blocked_.insert(op);
      }
    }
  }

  Policy policy_ = Policy::allow;
  std::set<std::string> blocked_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Entry>> stats_;
  std::unordered_map<const void*, Entry*> by_schema_;
};

// The PrivateUse1 fallback's boxed kernel: Fallback::get().run (defined once,
// in src/accelkit_torch_adapters.cpp).
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
