// The one class a vendor writes: accelkit's Runtime contract over your driver.
// Every member below is required (the table in <accelkit/runtime.hpp> gives
// the semantics of each, and the optional members you may add). Until a
// member is wired to the driver it reports "not implemented" as a driver
// error, and device_count() reports no device, so nothing calls the rest.
#pragma once

#include <accelkit/accelkit.hpp>

namespace vendor {

class VendorRuntime : public accelkit::Runtime<VendorRuntime> {
 public:
  // Your device type: device="vendor", VENDOR_VISIBLE_DEVICES, torch.vendor.
  static constexpr std::string_view name = "vendor";

  using device_index = accelkit::device_index;
  using CopyKind = accelkit::CopyKind;
  using StreamHandle = accelkit::StreamHandle;
  using EventHandle = accelkit::EventHandle;
  using EventFlags = accelkit::EventFlags;

  // Must not create a device context. Return the driver's count. A driver
  // that starts threads here (at its first device query) also declares
  //   static constexpr bool fork_safe_discovery = false;
  int device_count() { return 0; /* e.g. xxGetDeviceCount(&n) */ }

  // Fill the capability schema; must not create a device context. Leave the
  // uuid, architecture and async_copy_engines empty when the driver cannot
  // tell (the SDK derives a stable UUID); set memory_alignment when malloc
  // gives less than 256 B; give named priority hints as
  // StreamPriorityRange::from_levels(n).
  accelkit::DeviceProperties properties(device_index) { todo("properties"); }

  device_index get_device() { todo("get_device"); }
  void set_device(device_index) { todo("set_device"); }

  // Return nullptr when the device is out of memory (or refuses: the SDK
  // tells the two apart by the free memory). Aligned to at least
  // properties().memory_alignment.
  void* malloc(device_index, std::size_t) { todo("malloc"); }
  void free(device_index, void*) { todo("free"); }
  // Pinned host memory for copies of this device (a context's).
  void* host_malloc(device_index, std::size_t) { todo("host_malloc"); }
  void host_free(device_index, void*) { todo("host_free"); }

  void memcpy(device_index, void*, const void*, std::size_t, CopyKind) { todo("memcpy"); }
  // host_pinned: the host side is memory from host_malloc, kept untouched by
  // the SDK until the stream passes the copy; otherwise consume it before
  // returning.
  void memcpy_async(device_index, void*, const void*, std::size_t, CopyKind, StreamHandle,
                    bool /*host_pinned*/) {
    todo("memcpy_async");
  }
  void memset_async(device_index, void*, int, std::size_t, StreamHandle) {
    todo("memset_async");
  }

  StreamHandle stream_create(device_index, int) { todo("stream_create"); }
  void stream_destroy(device_index, StreamHandle) { todo("stream_destroy"); }
  bool stream_query(device_index, StreamHandle) { todo("stream_query"); }
  void stream_synchronize(device_index, StreamHandle) { todo("stream_synchronize"); }
  void stream_wait_event(device_index, StreamHandle, EventHandle) { todo("stream_wait_event"); }

  EventHandle event_create(device_index, EventFlags) { todo("event_create"); }
  void event_destroy(device_index, EventHandle) { todo("event_destroy"); }
  void event_record(device_index, EventHandle, StreamHandle) { todo("event_record"); }
  bool event_query(device_index, EventHandle) { todo("event_query"); }
  void event_synchronize(device_index, EventHandle) { todo("event_synchronize"); }

  void device_synchronize(device_index) { todo("device_synchronize"); }

 private:
  [[noreturn]] static void todo(const char* member) {
    driver_error(-1, member, "not implemented yet: wire this member to the driver");
  }
};

}  // namespace vendor
