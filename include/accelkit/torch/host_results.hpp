// accelkit: results of CPU operators made in device memory (Note [CPU
// results in device memory]): a CPU allocator that serves a thread inside a
// HostResults::Scope from a device's caching pool, and the adoption of
// such a result as a device tensor without a copy.
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <ATen/TensorUtils.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [CPU results in device memory]
// A CPU convolution allocates its result itself (through c10's CPU
// allocator); no kernel of it takes the memory to write. Run for a device
// whose memory the host addresses directly, its result would be copied into
// device memory, most of what a compiled CNN's forward costs over the CPU's
// (bench/compile_torch_bench.py).
//
// So while such a convolution runs on the host (inside a Scope, entered after
// the device's stream was waited for), the calling thread's CPU allocations
// come from the device's caching pool where it has room, and the result is
// adopted: its storage's memory becomes a device tensor's, not copied.
// c10's CPU allocator is wrapped when the backend registers (at import, so
// that two backends' modules wrap in turn, the later one wrapping the
// earlier), and the wrapper keeps serving every other allocation, every
// other thread's among them, with one thread-local read added.
//  - Where the device has no room without returning its cache (try_allocate),
//    the allocation is CPU memory: nothing is released or counted
//    as out of memory. The CPU kernel's temporaries can be far larger than
//    its result; a result in CPU memory is copied.
//  - A result is adopted only if its memory is a block of the Scope's
//    device, its storage is its alone (no other reference, weak ones
//    included) and it spans that storage; otherwise it is copied. So is
//    every result if something replaced c10's CPU allocator after the
//    wrapper (GetCPUAllocator is not ours: a Scope is then off); replacing
//    it while a convolution runs on another thread is not supported (a
//    oneDNN buffer of that convolution would go to the new allocator).
//  - The CPU kernel's temporaries come from the pool too and go back to it
//    when freed; while they live they count as the device's memory (its
//    statistics, its memory fraction), and another thread's device
//    allocation finds that much less room. A buffer a CPU kernel keeps past
//    the Scope (a cache of its own) stays device memory until it frees it.
//    The Scope counts as a host kernel, so a block handed out in it is handed
//    out after its stream has been waited for (Note [Host work on recycled
//    blocks]).
//  - oneDNN takes its buffers through raw_allocate and gives them back
//    through raw_deallocate (the raw deleter): a block handed out in a Scope
//    is a CPU DataPtr whose context is its pointer, as c10's CPU allocator
//    makes them, and the wrapper's raw deleter frees either kind, telling
//    them apart by a table of the blocks handed out (one relaxed atomic read
//    while it is empty, which it is outside Scopes but for temporaries kept).
//    The wrapped allocator's DataPtrs keep their deleters (c10 asks that
//    they be the raw deleter; changing every CPU allocation's deleter in the
//    process was judged worse than the raw deleter accepting both kinds). A
//    child forked meanwhile starts with an empty table (the blocks are the
//    parent's device memory, which the child leaves alone).
class HostResults {
 public:
  // Wraps c10's CPU allocator (once; the backend's registration does).
  static void install() { (void)wrapper(); }

  // The calling thread's CPU allocations come from `device`'s pool (whose
  // memory the host addresses directly, and whose current stream has been
  // waited for) while this lives, if the wrapper is c10's CPU allocator.
  class Scope {
   public:
    explicit Scope(const c10::Device& device)
        : guard_(device), on_(c10::GetCPUAllocator() == &wrapper()) {
      if (on_) ++depth_;
    }
    ~Scope() {
      if (on_) --depth_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    c10::DeviceGuard guard_;  // the pool the allocations come from
    HostKernelScope host_;
    bool on_;
  };

  // `out` (a CPU result made in a Scope on `device`) as a tensor of
  // `device` over the same memory, `out` left without it; an undefined
  // tensor if its memory is not a block of `device`'s pool, is shared, or
  // is more than it spans.
  static at::Tensor adopt(at::Tensor& out, const c10::Device& device) {
    if (!out.defined() || out.layout() != c10::kStrided || out.use_count() != 1) return {};
    c10::StorageImpl* s = out.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    if (!s) return {};
    {
      auto owned = c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(s);
      if (owned.use_count() != 2 || owned.weak_use_count() != 1) return {};  // `out`'s and ours
    }
    const c10::DataPtr& p = s->data_ptr();
    std::size_t nbytes = s->nbytes();
    if (!p.get() || p.get_deleter() != &free_block ||
        at::detail::computeStorageNbytes(out.sizes(), out.strides(), out.element_size(),
                                         out.storage_offset()) != nbytes ||
        !blocks().take(p.get(), device.index()))
      return {};
    c10::DataPtr cpu = s->set_data_ptr(c10::DataPtr());
    s->set_nbytes(0);
    void* ptr = cpu.release_context();  // the device tensor frees it
    c10::DataPtr memory = DeviceAllocator::wrap(ptr, device.index());
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                         std::move(memory), &device_allocator(),
                                                         /*resizable=*/true);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(std::move(storage)), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        out.dtype());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(out.sizes(), out.strides(), out.storage_offset());
    return t;
  }

 private:
  // The blocks handed out as CPU memory and not yet freed or adopted, with
  // their devices: their pointers are the DataPtrs' contexts (as c10's CPU
  // allocator's are, which raw_allocate requires), and raw_deallocate, which
  // the wrapper serves for both kinds, tells them from CPU memory here.
  class Blocks {
   public:
    void add(void* p, device_index d) {
      std::lock_guard<std::mutex> g(lock_);
      devices_.emplace(p, d);
      count_.store(devices_.size(), std::memory_order_relaxed);
    }
    // Removes `p` if it is a block (of `device`, where given); its device.
    std::optional<device_index> take(void* p, std::optional<device_index> device = std::nullopt) {
      if (count_.load(std::memory_order_relaxed) == 0) return std::nullopt;
      std::lock_guard<std::mutex> g(lock_);
      auto it = devices_.find(p);
      if (it == devices_.end() || (device && it->second != *device)) return std::nullopt;
      device_index d = it->second;
      devices_.erase(it);
      count_.store(devices_.size(), std::memory_order_relaxed);
      return d;
    }

   private:
    std::mutex lock_;
    std::unordered_map<void*, device_index> devices_;
    std::atomic<std::size_t> count_{0};
  };
  // Never destroyed (blocks may be freed from static destructors); a forked
  // child gets a new one (the old one's lock may be held by a thread the
  // child does not have).
  static Blocks*& blocks_slot() {
    static Blocks* b = [] {
      pthread_atfork(nullptr, nullptr, [] { blocks_slot() = new Blocks; });
      return new Blocks;
    }();
    return b;
  }
  static Blocks& blocks() { return *blocks_slot(); }

  static void free_device(void* p, device_index d) { free_device_memory(d, p); }
  // The deleter of a block handed out as CPU memory.
  static void free_block(void* p) {
    if (std::optional<device_index> d = blocks().take(p)) return free_device(p, *d);
    if (backend().in_bad_fork()) return;  // the parent's device memory
    report(Severity::error, backend_name(),
           fmt::format("device memory at {} freed as CPU memory was not handed out as such; "
                       "left allocated",
                       p));
  }

  // c10's CPU allocator before the wrapper, serving every allocation made
  // outside a Scope.
  struct Wrapper final : c10::Allocator {
    c10::Allocator* inner = nullptr;
    c10::DeleterFnPtr inner_raw = nullptr;
    c10::DataPtr allocate(std::size_t n) override {
      if (depth_ == 0 || n == 0) return inner->allocate(n);
      c10::DataPtr block = device_allocator().try_allocate(n);  // on the Scope's device
      if (!block) return inner->allocate(n);  // no room there: CPU memory
      void* p = block.get();
      blocks().add(p, block.device().index());  // may throw: `block` frees it
      block.release_context();
      return c10::DataPtr(p, p, &free_block, c10::Device(c10::DeviceType::CPU));
    }
    c10::DeleterFnPtr raw_deleter() const override { return inner_raw ? &raw_free : nullptr; }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
      default_copy_data(dest, src, count);
    }
  };
  // raw_deallocate's deleter: a block handed out as CPU memory, or CPU memory.
  static void raw_free(void* p) {
    if (std::optional<device_index> d = blocks().take(p)) return free_device(p, *d);
    wrapper().inner_raw(p);
  }
  // The wrapper, wrapping c10's CPU allocator the first time.
  static Wrapper& wrapper() {
    static Wrapper* w = [] {
      (void)blocks();
      auto* made = new Wrapper;  // never destroyed: CPU memory outlives statics
      made->inner = c10::GetCPUAllocator();
      made->inner_raw = made->inner->raw_deleter();
      c10::SetCPUAllocator(made, /*priority=*/0);
      return made;
    }();
    return *w;
  }

  static inline thread_local int depth_ = 0;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
