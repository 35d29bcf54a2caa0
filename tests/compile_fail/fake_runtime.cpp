// A runtime that implements exactly the contract, each member removable
// (-DOMIT_<member>) or replaceable by a mistyped one (-DMISTYPE_<member>), to
// prove that each contract diagnostic fires and names its member. Compiled
// with -fsyntax-only by run_compile_fail.cmake; see tests/CMakeLists.txt.
#include <accelkit/device/backend.hpp>

using namespace accelkit;

#ifdef NOT_DERIVED
struct Fake {
#else
struct Fake : Runtime<Fake> {
#endif
#if defined(INVALID_NAME)
  static constexpr std::string_view name = "cuda";
#elif !defined(OMIT_name)
  static constexpr std::string_view name = "fake";
#endif

#ifndef OMIT_device_count
  int device_count() { return 1; }
#endif
#if defined(MISTYPE_properties)
  int properties(device_index) { return 0; }
#elif !defined(OMIT_properties)
  DeviceProperties properties(device_index) { return {}; }
#endif
#ifndef OMIT_get_device
  device_index get_device() { return 0; }
#endif
#ifndef OMIT_set_device
  void set_device(device_index) {}
#endif
#if defined(MISTYPE_malloc)
  int* malloc(device_index, std::size_t) { return nullptr; }
#elif !defined(OMIT_malloc)
  void* malloc(device_index, std::size_t) { return nullptr; }
#endif
#ifndef OMIT_free
  void free(device_index, void*) {}
#endif
#ifndef OMIT_host_malloc
  void* host_malloc(std::size_t) { return nullptr; }
#endif
#ifndef OMIT_host_free
  void host_free(void*) {}
#endif
#if defined(MISTYPE_memcpy)
  void memcpy(device_index, void*, const void*, std::size_t) {}  // no CopyKind
#elif !defined(OMIT_memcpy)
  void memcpy(device_index, void*, const void*, std::size_t, CopyKind) {}
#endif
#ifndef OMIT_memcpy_async
  void memcpy_async(device_index, void*, const void*, std::size_t, CopyKind, StreamHandle) {}
#endif
#ifndef OMIT_memset_async
  void memset_async(device_index, void*, int, std::size_t, StreamHandle) {}
#endif
#ifndef OMIT_stream_create
  StreamHandle stream_create(device_index, int) { return {}; }
#endif
#ifndef OMIT_stream_destroy
  void stream_destroy(device_index, StreamHandle) {}
#endif
#if defined(MISTYPE_stream_query)
  int stream_query(device_index, StreamHandle) { return 1; }
#elif !defined(OMIT_stream_query)
  bool stream_query(device_index, StreamHandle) { return true; }
#endif
#ifndef OMIT_stream_synchronize
  void stream_synchronize(device_index, StreamHandle) {}
#endif
#if defined(MISTYPE_stream_wait_event)
  void stream_wait_event(device_index, EventHandle, StreamHandle) {}  // swapped
#elif !defined(OMIT_stream_wait_event)
  void stream_wait_event(device_index, StreamHandle, EventHandle) {}
#endif
#ifndef OMIT_event_create
  EventHandle event_create(device_index, EventFlags) { return {}; }
#endif
#ifndef OMIT_event_destroy
  void event_destroy(device_index, EventHandle) {}
#endif
#ifndef OMIT_event_record
  void event_record(device_index, EventHandle, StreamHandle) {}
#endif
#ifndef OMIT_event_query
  bool event_query(device_index, EventHandle) { return true; }
#endif
#ifndef OMIT_event_synchronize
  void event_synchronize(device_index, EventHandle) {}
#endif
#ifndef OMIT_device_synchronize
  void device_synchronize(device_index) {}
#endif

  // Optional members: absent by default; MISTYPE_* adds a mistyped one.
#ifdef MISTYPE_event_elapsed_time
  double event_elapsed_time(device_index, EventHandle, EventHandle) { return 0; }
#endif
#ifdef MISTYPE_can_access_peer
  bool can_access_peer(device_index) { return false; }
#endif
#ifdef MISTYPE_memory_info
  std::size_t memory_info(device_index) { return 0; }
#endif
};

int main() {
  Backend<Fake> backend(Environment::fixed({}));
  return backend.device_count();
}
