// accelkit: the SDK's blocking waits release Python's GIL, and history
// contexts gathered without Python frames. Includes no PyTorch or Python
// header.
//
// Note [Blocking waits release the GIL]
// Problem: a thread may block in the SDK, waiting for a stream, an event or
// the device, while it holds Python's GIL: PyTorch's Python bindings release
// it around an operator, but an operator reached through Python dispatch
// (DTensor's __torch_dispatch__, which FSDP2's sharded parameters use, or a
// torch.library kernel written in Python) runs its C++ kernels with the GIL
// taken again. When the work waited for can finish only after Python code
// runs on another thread, the process deadlocks: a stream that waits for a
// host signal of accelkit.distributed, which the collective's completion
// thread (Python) completes, waited for by a host kernel under DTensor
// dispatch (FSDP2's optimizer step).
// Decision: every blocking wait of the torch adapters (stream, event and
// device synchronize, empty_cache, a copy to or from pageable memory, which
// a driver may make wait for the stream) releases the GIL for its duration
// when the calling thread holds it, as torch.cuda.synchronize()'s binding
// does (the `released` entries of Note [Backend interface]'s lists).
// Limits: Python is not linked: its functions are looked up once in the
// process (dlsym); in a process without Python they are absent and nothing
// is released. A thread holds the GIL when it has a Python thread state and
// PyGILState_Check says so (alone, that answers yes on every thread once
// subinterpreters have turned its check off).
#pragma once

#include <accelkit/config.hpp>

#include <dlfcn.h>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

class PythonLockRelease {
 public:
  PythonLockRelease() noexcept {
    const Api& api = python();
    if (api.check != nullptr && api.this_thread() != nullptr && api.check() != 0)
      state_ = api.save();
  }
  ~PythonLockRelease() {
    if (state_ != nullptr) python().restore(state_);
  }
  PythonLockRelease(const PythonLockRelease&) = delete;
  PythonLockRelease& operator=(const PythonLockRelease&) = delete;

 private:
  struct Api {
    int (*check)() = nullptr;          // PyGILState_Check
    void* (*this_thread)() = nullptr;  // PyGILState_GetThisThreadState
    void* (*save)() = nullptr;         // PyEval_SaveThread
    void (*restore)(void*) = nullptr;  // PyEval_RestoreThread
  };
  static const Api& python() noexcept {
    static const Api api = [] {
      Api a;
      auto check = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "PyGILState_Check"));
      auto this_thread = reinterpret_cast<void* (*)()>(
          ::dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState"));
      auto save = reinterpret_cast<void* (*)()>(::dlsym(RTLD_DEFAULT, "PyEval_SaveThread"));
      auto restore =
          reinterpret_cast<void (*)(void*)>(::dlsym(RTLD_DEFAULT, "PyEval_RestoreThread"));
      if (check != nullptr && this_thread != nullptr && save != nullptr && restore != nullptr) {
        a.check = check;
        a.this_thread = this_thread;
        a.save = save;
        a.restore = restore;
      }
      return a;
    }();
    return api;
  }
  void* state_ = nullptr;
};

inline thread_local int python_frames_off = 0;

// While one lives, the history contexts the calling thread gathers have no
// Python frames (gathering them takes the GIL): hold one across an
// allocation or free made under a lock that a thread holding the GIL may
// wait for (Note [History frames] in torch/history.hpp).
class PythonFramesOff {
 public:
  PythonFramesOff() noexcept { ++python_frames_off; }
  ~PythonFramesOff() { --python_frames_off; }
  PythonFramesOff(const PythonFramesOff&) = delete;
  PythonFramesOff& operator=(const PythonFramesOff&) = delete;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
