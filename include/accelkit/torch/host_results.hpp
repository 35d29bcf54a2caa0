// accelkit: results of CPU operators made in device memory (Note [CPU
// results in device memory]): a CPU allocator that serves a thread inside a
// HostResults<R>::Scope from a device's caching pool, and the adoption of
// such a result as a device tensor without a copy.
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
namespace torch_adapter {

// Note [CPU results in device memory]
// A CPU convolution allocates its result itself (through c10's CPU
// allocator); no kernel of it takes the memory to write. Run for a device
// whose memory the host addresses directly, its result was then copied into
// device memory: 207 of the 332 us per forward that the compiled CNN of
// bench/compile_torch_bench.py took over the CPU's, on one core.
//
// So while such a convolution runs on the host (inside a Scope, entered after
// the device's stream was waited for), the calling thread's CPU allocations
// come from the device's caching pool, and the result is adopted: its
// storage's memory becomes a device tensor's, not copied. The allocator c10
// had for the CPU is wrapped, once, and keeps serving every other
// allocation, every other thread's among them; the wrapper adds one
// thread-local read to a CPU allocation.
//  - A result is adopted only if its memory came from the pool for the
//    Scope's device and its storage is its alone; otherwise it is copied as
//    before. So is every result if something replaced c10's CPU allocator
//    after the wrapper (GetCPUAllocator is not ours: a Scope is then off).
//  - The CPU kernel's temporaries come from the pool too and go back to it
//    when freed. The Scope counts as a host kernel, so a block handed out in
//    it is handed out after its stream has been waited for (Note [Host work
//    on recycled blocks]).
//  - oneDNN takes its buffers through raw_allocate and gives them back
//    through raw_deallocate (the raw deleter): a block handed out in a Scope
//    is a CPU DataPtr whose context is its pointer, as c10's CPU allocator
//    makes them, and the wrapper's raw deleter frees either kind, telling
//    them apart by a table of the blocks handed out (one relaxed atomic read
//    while it is empty, which it is outside Scopes but for temporaries kept).
//    Its other DataPtrs keep the deleters the wrapped allocator gave them.
//  - A convolution whose memory does not fit in the device's (out of memory
//    in a Scope: the CPU kernel's temporaries can be far larger than its
//    result) runs again outside it, in CPU memory, and its result is copied,
//    so a device that ran it before still does. The failed attempt counts
//    in num_ooms and releases the cache, as any out of memory does.
template <class R>
class HostResults {
 public:
  // The calling thread's CPU allocations come from `device`'s pool (whose
  // memory the host addresses directly, and whose current stream has been
  // waited for) while this lives, if the wrapper is c10's CPU allocator.
  class Scope {
   public:
    explicit Scope(const c10::Device& device) : guard_(device), on_(wrapper_installed()) {
      if (on_) ++depth_;
    }
    ~Scope() {
      if (on_) --depth_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    bool on() const noexcept { return on_; }

   private:
    c10::DeviceGuard guard_;  // the pool the allocations come from
    HostKernelScope host_;
    bool on_;
  };

  // `out` (a CPU result made in a Scope on `device`) as a tensor of
  // `device` over the same memory, `out` left without it; an undefined
  // tensor if its memory is not a block of `device`'s pool or is shared.
  static at::Tensor adopt(at::Tensor& out, const c10::Device& device) {
    if (!out.defined() || out.layout() != c10::kStrided || out.use_count() != 1) return {};
    c10::StorageImpl* s = out.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    if (!s || c10::raw::intrusive_ptr::use_count(s) != 1) return {};
    const c10::DataPtr& p = s->data_ptr();
    if (!p.get() || p.get_deleter() != &free_block) return {};
    std::optional<device_index> d = take(p.get());
    if (!d) return {};
    if (*d != device.index()) {  // kept, freed as before
      remember(p.get(), *d);
      return {};
    }
    std::size_t nbytes = s->nbytes();
    c10::DataPtr cpu = s->set_data_ptr(c10::DataPtr());
    void* ptr = cpu.release_context();  // the device tensor frees it
    c10::DataPtr memory(ptr, context(ptr, *d), &DeviceAllocator<R>::deleter, device);
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                         std::move(memory), &device_allocator<R>(),
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
  struct Blocks {
    std::mutex lock;
    std::unordered_map<void*, device_index> devices;
    std::atomic<std::size_t> count{0};
  };
  static Blocks& blocks() {
    static auto* b = new Blocks;  // never destroyed: blocks may be freed from static destructors
    return *b;
  }
  static void remember(void* p, device_index d) {
    Blocks& b = blocks();
    std::lock_guard<std::mutex> g(b.lock);
    b.devices.emplace(p, d);
    b.count.store(b.devices.size(), std::memory_order_relaxed);
  }
  static std::optional<device_index> take(void* p) {
    Blocks& b = blocks();
    if (b.count.load(std::memory_order_relaxed) == 0) return std::nullopt;
    std::lock_guard<std::mutex> g(b.lock);
    auto it = b.devices.find(p);
    if (it == b.devices.end()) return std::nullopt;
    device_index d = it->second;
    b.devices.erase(it);
    b.count.store(b.devices.size(), std::memory_order_relaxed);
    return d;
  }
  static void* context(void* p, device_index d) {  // Note [DataPtr context]
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | static_cast<std::uintptr_t>(d));
  }
  // The deleter of a block handed out as CPU memory.
  static void free_block(void* p) {
    if (std::optional<device_index> d = take(p)) DeviceAllocator<R>::deleter(context(p, *d));
  }

  // c10's CPU allocator before the wrapper, serving every allocation made
  // outside a Scope.
  struct Wrapper final : c10::Allocator {
    c10::Allocator* inner = nullptr;
    c10::DeleterFnPtr inner_raw = nullptr;
    c10::DataPtr allocate(std::size_t n) override {
      if (depth_ == 0 || n == 0) return inner->allocate(n);
      c10::DataPtr block = device_allocator<R>().allocate(n);  // on the Scope's device
      void* p = block.get();
      remember(p, block.device().index());
      block.release_context();
      return c10::DataPtr(p, p, &free_block, c10::Device(c10::DeviceType::CPU));
    }
    c10::DeleterFnPtr raw_deleter() const override { return inner_raw ? &raw_free : nullptr; }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
      std::memcpy(dest, src, count);
    }
  };
  static Wrapper*& wrapper() {
    static Wrapper* w = nullptr;
    return w;
  }
  // raw_deallocate's deleter: a block handed out as CPU memory, or CPU memory.
  static void raw_free(void* p) {
    if (std::optional<device_index> d = take(p)) return DeviceAllocator<R>::deleter(context(p, *d));
    wrapper()->inner_raw(p);
  }

  // Wraps c10's CPU allocator the first time; whether it is the wrapper now.
  static bool wrapper_installed() {
    static Wrapper* w = [] {
      auto* wrapper_ = new Wrapper;  // never destroyed: CPU memory outlives statics
      wrapper_->inner = c10::GetCPUAllocator();
      wrapper_->inner_raw = wrapper_->inner->raw_deleter();
      wrapper() = wrapper_;
      c10::SetCPUAllocator(wrapper_, /*priority=*/0);
      return wrapper_;
    }();
    return c10::GetCPUAllocator() == w;
  }

  static inline thread_local int depth_ = 0;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
