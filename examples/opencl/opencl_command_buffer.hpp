// ocl's graphs: a captured stream's commands recorded into a
// cl_khr_command_buffer, and the graph that keeps what they use alive
// (Note [ocl graphs]). The runtime's seven graph members
// (opencl_runtime.hpp) are written over these.
//
// Note [ocl graphs]
// Problem: the contract captures a stream's work into a graph that reads
// device memory when launched, launches it many times on any stream of the
// device, and lets it be destroyed while launches are queued. OpenCL's
// cl_khr_command_buffer records commands and enqueues them again, but in
// its revisions 0.9.0 to 0.9.4 (the one the Khronos headers here declare;
// PoCL 3.1 implements 0.9.0) it records no SVM copy or fill, only commands
// on cl_mem buffers, and PoCL 3.1 reads a recorded kernel's arguments from
// the cl_kernel object when the command buffer runs, not when the command
// was recorded (as the extension says).
// Decision: where the device lists cl_khr_command_buffer at revision 0.9.0
// to 0.9.4 (CL_DEVICE_EXTENSIONS_WITH_VERSION) and its entry points resolve
// (clGetExtensionFunctionAddressForPlatform), begin_capture creates a
// command buffer on the stream's queue (simultaneous use where the device
// has it). While the stream captures, memcpy_async and memset_async record
// clCommandCopyBufferKHR and clCommandFillBufferKHR on one cl_mem per
// allocation they touch (clCreateBuffer with CL_MEM_USE_HOST_PTR over the
// allocation's base: OpenCL 2.0 makes such a buffer use the SVM memory
// itself; pinned memory likewise), at the offsets of the pointers; a kernel
// (enqueue_kernel) records clCommandNDRangeKernelKHR on a clone of its
// cl_kernel (clCloneKernel copies the arguments as set), so that later
// launches of the kernel leave the recorded one unchanged. Each recorded
// command waits for the one before (a sync point), in the queue's order.
// End finalizes; the finalized buffer is the executable (instantiate
// shares it); a launch enqueues it on the launching stream's queue
// (clEnqueueCommandBufferKHR with that queue), as that stream's last command
// (Note [ocl last command]). The graph keeps its allocations' bounds, and a
// launch after one was freed is refused (a DriverError naming the address),
// since its buffer would reach freed memory. A graph destroyed while launches
// are queued releases its command buffer, clones and buffers when the last
// of them completes (clSetEventCallback).
// Limits: one queue per command buffer (no fork and join: the SDK captures
// one stream); a device without a cl_khr_command_buffer that this backend
// can use cannot capture (NotSupportedError naming the reason; PoCL's CPU
// device can); a launch on a queue the driver calls incompatible with the
// capturing one (another priority, on a device with priority hints) is the
// driver's CL_INCOMPATIBLE_COMMAND_QUEUE_KHR; work enqueued on a queue
// behind the runtime's back (enqueue_on, a raw OpenCL call) cannot be
// captured and is refused while the stream captures.
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace ocl {

// cl_khr_command_buffer's entry points on one platform (0.9.0 to 0.9.4
// signatures: the Khronos headers of 2023).
struct CommandBufferApi {
  clCreateCommandBufferKHR_fn create = nullptr;
  clFinalizeCommandBufferKHR_fn finalize = nullptr;
  clReleaseCommandBufferKHR_fn release = nullptr;
  clEnqueueCommandBufferKHR_fn enqueue = nullptr;
  clCommandCopyBufferKHR_fn copy = nullptr;
  clCommandFillBufferKHR_fn fill = nullptr;
  clCommandNDRangeKernelKHR_fn kernel = nullptr;

  // Resolves them on `platform`; false when one is missing.
  bool resolve(cl_platform_id platform) {
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          clGetExtensionFunctionAddressForPlatform(platform, name));
      return fn != nullptr;
    };
    return get(create, "clCreateCommandBufferKHR") &&
           get(finalize, "clFinalizeCommandBufferKHR") &&
           get(release, "clReleaseCommandBufferKHR") &&
           get(enqueue, "clEnqueueCommandBufferKHR") && get(copy, "clCommandCopyBufferKHR") &&
           get(fill, "clCommandFillBufferKHR") && get(kernel, "clCommandNDRangeKernelKHR");
  }
};

// What a captured graph holds: the command buffer and the OpenCL objects its
// commands use, released together (after the last queued launch, Note [ocl
// graphs]).
struct Recording {
  CommandBufferApi api;  // a copy: a release may come after the runtime is gone
  cl_command_buffer_khr buffer = nullptr;
  std::vector<cl_kernel> kernels;  // the clones the kernel commands run
  std::map<const void*, cl_mem> mems;  // allocation base -> its buffer
  bool has_last = false;
  cl_sync_point_khr last = 0;  // the last recorded command's
  std::size_t commands = 0;

  Recording() = default;
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  ~Recording() {
    if (buffer) api.release(buffer);
    for (cl_kernel k : kernels) clReleaseKernel(k);
    for (auto& m : mems) clReleaseMemObject(m.second);
  }

  // The wait list of the next command: the one before it (in order).
  cl_uint waits() const { return has_last ? 1u : 0u; }
  const cl_sync_point_khr* wait_list() const { return has_last ? &last : nullptr; }
  void recorded(cl_sync_point_khr point) {
    last = point;
    has_last = true;
    ++commands;
  }
};

// An allocation a graph reads or writes: its base and size, and whether it
// is pinned host memory (host_malloc) or device memory (malloc).
struct Touch {
  const void* base;
  std::size_t bytes;
  bool pinned;
};

// A captured graph: the recording, the allocations it touches, and its
// launches not yet known complete. Execs share it.
struct Graph {
  int device = 0;
  std::shared_ptr<Recording> recording;
  std::vector<Touch> touches;
  std::mutex mutex;
  std::vector<cl_event> pending;  // launches' events (retained)

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Keeps a launch's event (already retained for it), dropping those that
  // completed.
  void launched(cl_event e) {
    std::lock_guard<std::mutex> lock(mutex);
    prune();
    pending.push_back(e);
  }
  // Waits for the queued launches (a device without simultaneous use).
  void wait_pending() {
    std::vector<cl_event> wait;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (cl_event e : pending) {
        clRetainEvent(e);
        wait.push_back(e);
      }
    }
    if (!wait.empty()) clWaitForEvents(static_cast<cl_uint>(wait.size()), wait.data());
    for (cl_event e : wait) clReleaseEvent(e);
  }

  // The recording outlives the graph until its queued launches complete
  // (Note [ocl graphs]): each holds a reference, dropped by its callback.
  ~Graph() {
    prune();
    for (cl_event e : pending) {
      auto* keep = new std::shared_ptr<Recording>(recording);
      if (clSetEventCallback(e, CL_COMPLETE, &drop, keep) != CL_SUCCESS) {
        clWaitForEvents(1, &e);  // no callback: the launch is waited for here
        delete keep;
      }
      clReleaseEvent(e);
    }
  }

 private:
  static void CL_CALLBACK drop(cl_event, cl_int, void* keep) {
    delete static_cast<std::shared_ptr<Recording>*>(keep);
  }
  // Drops the events of launches that completed (or failed: their error is
  // the stream's to report, Note [ocl asynchronous errors]).
  void prune() {
    std::size_t kept = 0;
    for (cl_event e : pending) {
      cl_int status = CL_COMPLETE;
      clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
      if (status <= CL_COMPLETE) clReleaseEvent(e);
      else pending[kept++] = e;
    }
    pending.resize(kept);
  }
};

// An executable graph: OpenCL's finalized command buffer is executable
// already, so an exec shares its graph's.
struct GraphExec {
  std::shared_ptr<Graph> graph;
};

}  // namespace ocl
