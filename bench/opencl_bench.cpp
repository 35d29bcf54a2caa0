// The ocl backend (examples/opencl) against raw OpenCL calls on the same
// device, each pair measured in the same run, taking turns (bench/rounds.hpp):
//  - allocation hit path: accelkit's caching pool (allocate + deallocate of a
//    cached block) against clSVMAlloc + clSVMFree;
//  - event record + query: a pooled accelkit Event over the runtime (a plain
//    record keeps the queue's last command: Note [ocl last command]) against
//    what a backend without the SDK does, a marker per record
//    (clEnqueueMarkerWithWaitList + clFlush + clGetEventInfo + release);
//  - host<->device copy bandwidth at 256 MiB: the runtime's memcpy_async
//    plus a stream synchronize, against clEnqueueSVMMemcpy (blocking) on a
//    queue of the benchmark's own, pinned (host_malloc) and pageable.
//
//   opencl_bench            the full run
//   opencl_bench --quick    tiny sizes, to check that it runs
#include <accelkit/accelkit.hpp>

#include "machine.hpp"
#include "opencl_runtime.hpp"
#include "rounds.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace accelkit;
using Clock = std::chrono::steady_clock;
using OclBackend = Backend<ocl::OpenCLRuntime>;

namespace {
using bench::ns_per_call;
volatile std::int64_t sink = 0;

void ok(cl_int err, const char* what) {
  if (err != CL_SUCCESS) {
    std::fprintf(stderr, "opencl_bench: %s failed: %d\n", what, err);
    std::exit(1);
  }
}
}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  bench::print_machine();
  auto print_load = [](const char* when) {  // a loaded machine's figures read differently
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) == 3)
      std::printf("load average at the %s: %.1f %.1f %.1f\n", when, load[0], load[1], load[2]);
  };
  print_load("start");
  OclBackend backend(Environment::fixed({}));
  if (backend.device_count() < 1) {
    std::puts("opencl_bench: no OpenCL device with SVM");
    return 1;
  }
  ocl::OpenCLRuntime& rt = backend.runtime();
  const DeviceProperties& props = backend.properties(0);
  std::printf("ocl benchmark%s: the ocl backend vs raw OpenCL on %s (%s, %s SVM)\n\n",
              quick ? " (quick smoke run: figures not meaningful)" : "", props.name.c_str(),
              props.extra<std::string>("ocl.platform").value_or("?").c_str(),
              props.extra<std::string>("ocl.svm").value_or("?").c_str());
  backend.set_device(0);
  Streams<ocl::OpenCLRuntime> streams(backend);
  Stream s = streams.pool_stream(0);
  StreamHandle h = streams.handle(s);
  cl_context ctx = rt.cl_context_of(0);
  cl_device_id dev = rt.cl_device_of(0);
  cl_int err = CL_SUCCESS;
  cl_command_queue raw_q = clCreateCommandQueueWithProperties(ctx, dev, nullptr, &err);
  ok(err, "clCreateCommandQueueWithProperties");
  cl_mem_flags svm_flags =
      CL_MEM_READ_WRITE | (rt.svm() == ocl::Svm::fine ? CL_MEM_SVM_FINE_GRAIN_BUFFER : 0);

  const int rounds = quick ? 3 : 9;
  auto header = [&](const char* title, const char* unit) {
    std::printf("== %s (%s, median [25%%-75%%] of %d rounds) ==\n", title, unit, rounds);
    std::printf("%-26s %24s %24s %18s\n", "operation", "ocl backend", "raw OpenCL",
                "raw/ocl");
  };
  auto print = [](const char* what, const bench::Spread& a, const bench::Spread& b,
                  const bench::Spread& r, int digits) {
    std::printf("%-26s %24s %24s %18s\n", what, bench::format(a, digits).c_str(),
                bench::format(b, digits).c_str(), (bench::format(r, 2) + "x").c_str());
  };

  // ---------------------------------------------- allocation hit path
  {
    header("allocation: allocate + free", "ns per pair");
    DeviceCachingAllocator<ocl::OpenCLRuntime> pool(backend, 0, AllocatorConfig{});
    long n = quick ? 200 : 20000;
    for (std::size_t bytes : {std::size_t{256}, std::size_t{64} << 10, std::size_t{16} << 20}) {
      pool.deallocate(pool.allocate(bytes, h));  // the block is cached from now on
      bench::Spread a, b, r;
      bench::interleaved(
          rounds,
          [&] { return ns_per_call(n, [&] { pool.deallocate(pool.allocate(bytes, h)); }); },
          [&] {
            return ns_per_call(n, [&] {
              void* p = clSVMAlloc(ctx, svm_flags, bytes, 128);  // the alignment ocl declares
              sink = sink + (p != nullptr);
              clSVMFree(ctx, p);
            });
          },
          a, b, r);
      std::string what = "hit, " + std::to_string(bytes >= (1u << 20) ? bytes >> 20 : bytes >= 1024 ? bytes >> 10 : bytes) +
                         (bytes >= (1u << 20) ? " MiB" : bytes >= 1024 ? " KiB" : " B");
      print(what.c_str(), a, b, r, 1);
    }
    pool.empty_cache();
  }

  // ------------------------------------------------ event record + query
  {
    std::puts("");
    header("event record + query", "ns per use");
    long n = quick ? 200 : 20000;
    void* scratch = rt.malloc(0, 4096);
    for (bool busy : {false, true}) {
      bench::Spread a, b, r;
      bench::interleaved(
          rounds,
          [&] {
            if (busy) rt.memset_async(0, scratch, 0, 64, h);
            double ns = ns_per_call(n, [&] {
              Event<ocl::OpenCLRuntime> e(streams);
              e.record(s);
              sink = sink + e.query();
            });
            backend.stream_synchronize(0, h);
            return ns;
          },
          [&] {
            if (busy) rt.memset_async(0, scratch, 0, 64, h);
            double ns = ns_per_call(n, [&] {
              cl_event m = nullptr;
              clEnqueueMarkerWithWaitList(raw_q, 0, nullptr, &m);
              clFlush(raw_q);
              cl_int st = 0;
              clGetEventInfo(m, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr);
              sink = sink + (st == CL_COMPLETE);
              clReleaseEvent(m);
            });
            clFinish(raw_q);
            backend.stream_synchronize(0, h);
            return ns;
          },
          a, b, r);
      print(busy ? "record + query, after work" : "record + query, idle", a, b, r, 1);
    }
    rt.free(0, scratch);
  }

  // ---------------------------------------------- copy bandwidth
  {
    std::puts("");
    header("copy bandwidth, 256 MiB", "GB/s");
    std::size_t bytes = quick ? (std::size_t{4} << 20) : (std::size_t{256} << 20);
    void* d = rt.malloc(0, bytes);
    void* pinned = rt.host_malloc(0, bytes);
    std::vector<unsigned char> pageable(bytes, 1);
    std::memset(pinned, 1, bytes);
    auto gbps = [&](auto&& f) {
      auto t0 = Clock::now();
      f();
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      return static_cast<double>(bytes) / s / 1e9;
    };
    struct Case {
      const char* what;
      void* host;
      CopyKind kind;
    };
    for (Case c : {Case{"host->device, pinned", pinned, CopyKind::host_to_device},
                   Case{"device->host, pinned", pinned, CopyKind::device_to_host},
                   Case{"host->device, pageable", pageable.data(), CopyKind::host_to_device},
                   Case{"device->host, pageable", pageable.data(), CopyKind::device_to_host}}) {
      bool h2d = c.kind == CopyKind::host_to_device;
      void* dst = h2d ? d : c.host;
      const void* src = h2d ? c.host : d;
      bench::Spread a, b, r;
      // Higher is better: the ratio printed is ours/raw, so it reads as the
      // share of the raw bandwidth the backend reaches.
      bench::interleaved(
          rounds,
          [&] {
            return 1.0 / gbps([&] {
              backend.memcpy_async(0, dst, src, bytes, c.kind, h, c.host == pinned);
              backend.stream_synchronize(0, h);
            });
          },
          [&] {
            return 1.0 / gbps([&] {
              ok(clEnqueueSVMMemcpy(raw_q, CL_TRUE, dst, src, bytes, 0, nullptr, nullptr),
                 "clEnqueueSVMMemcpy");
            });
          },
          a, b, r);
      auto inv = [](bench::Spread x) { return bench::Spread{1 / x.median, 1 / x.p75, 1 / x.p25}; };
      print(c.what, inv(a), inv(b), r, 2);
    }
    rt.host_free(0, pinned);
    rt.free(0, d);
  }
  std::puts("\n(raw/ocl: above 1 the backend is faster for times; for bandwidth the ratio is "
            "the backend's share of the raw figure)");
  clReleaseCommandQueue(raw_q);
  print_load("end");
  return 0;
}
