// accelkit: the per-thread counts of host kernels and device work that the
// allocator, the host kernels, the fallback and the profiler share.
#pragma once

#include <accelkit/torch/common.hpp>

#include <cstdint>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Device work inside host kernels]: a host kernel (host_kernels.hpp)
// is the current stream's work done on the host, in order. A device
// operation it issues (the zero_() of an output before a CPU kernel writes
// into it) must therefore be finished before the kernel's host code goes on;
// while this count is non-zero on a thread, the operators below wait for
// what they queue. On a device with host-visible memory they do not queue at
// all: they wait for the stream and do the work on the host thread, as the
// host kernel itself does. Queueing it would cost two thread switches (the
// stream's worker wakes, then the waiting thread), which on a virtual
// machine with idle cores is tens of microseconds for a memset of a few
// bytes.
inline thread_local int host_kernel_depth = 0;

// Note [Device work of an operator]: a count, per thread, of the device
// work the thread has done or queued through the SDK: each wait of a host
// access for the current stream before the host works on device memory or
// after queueing work on it (HostAccess: copies, fills, storage moves, the
// host kernels, the fallback's views), and each operator run through the
// CPU fallback or as a host kernel. The Kineto session (Note [Kineto device
// activities]) compares it at every mark, so that an operator that did no
// device work (a view, an allocation, a dtype query, an operator on CPU
// tensors) gets no device activity, as a CUDA operator that launched no
// kernel gets none. A vendor kernel reports its launch with
// Kernels::enqueued() (torch/kernels.hpp), which counts it; other work
// the SDK does not see is reported with note_device_work(). A
// count cannot tell an operator's own work from its children's where both
// fall in its own time: a host kernel waits for the stream (counted) and
// then runs a CPU kernel that may call another operator of the device
// (relu calling clamp_min), so both show work.
inline thread_local std::uint64_t device_work = 0;
inline void note_device_work() noexcept { ++device_work; }

// The host's access to one device's mapped memory for the length of a host
// path (Note [Map scopes]); torch/host_access.hpp.
class MapScope;

struct HostKernelScope {
  HostKernelScope() noexcept { ++host_kernel_depth; }
  ~HostKernelScope() { --host_kernel_depth; }
  HostKernelScope(const HostKernelScope&) = delete;
  HostKernelScope& operator=(const HostKernelScope&) = delete;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
