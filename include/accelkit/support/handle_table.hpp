// accelkit/support: a runtime's table from the contract's opaque handles
// (StreamHandle, EventHandle, SignalHandle) to its own objects.
//
//   HandleTable<StreamHandle, Stream> streams{"acme", "stream", ACME_INVALID_HANDLE};
//   StreamHandle h = streams.add(std::make_shared<Stream>(...));
//   std::shared_ptr<Stream> s = streams.get(h, "stream_query");  // throws for a stale h
//   streams.remove(h, "stream_destroy");
//
// Thread-safe: every member takes the table's lock, and the objects are
// shared, so an object that one thread removes stays alive for another
// thread that found it first (its call finishes on it).
//
// Note [Minted handles]
// Problem: a runtime that hands out its objects' addresses as handles
// (from_pointer(obj.get())) cannot tell a stale handle from a live one once
// the allocator gives a new object the old address: a use after destroy then
// acts on an unrelated stream or event, silently.
// Decision: add(object) mints the handle from a counter per handle kind,
// shared by the tables of one program or shared library, so a value is
// never given twice there: a stale handle is always an error naming the
// backend, the call, the kind and the value, with the runtime's driver code.
// add(handle, object) keeps a handle the driver chose (a cudaStream_t, a
// cl_command_queue) for runtimes whose kernels must read the driver's object
// from the handle alone.
// Limits: with driver-chosen handles a stale handle is caught only until the
// driver reuses the value. Minted values are small integers, not pointers: a
// runtime that minted them must look its objects up (get), never cast.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

namespace detail {
// One counter per handle kind, shared by the tables of a program or shared
// library (Note [Minted handles]).
template <class Handle>
inline std::atomic<std::uintptr_t> next_handle{1};
}  // namespace detail

template <class Handle, class Object>
class HandleTable {
 public:
  // `backend`: the runtime's name, for errors; `kind`: what the handles name
  // ("stream", "event", "signal"); both are viewed, not copied (a runtime's
  // static name and a literal); `invalid_code`: the driver's code for a
  // handle that names nothing (CUDA's cudaErrorInvalidResourceHandle,
  // OpenCL's CL_INVALID_EVENT...).
  HandleTable(std::string_view backend, std::string_view kind, std::int64_t invalid_code)
      : backend_(backend), kind_(kind), invalid_code_(invalid_code) {}
  // A table of the SDK's or the runtime's own handles, which no driver
  // checks: a handle that names nothing is a ValueError.
  HandleTable(std::string_view backend, std::string_view kind) : backend_(backend), kind_(kind) {}
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  // Keeps `object` under a newly minted handle (Note [Minted handles]).
  Handle add(std::shared_ptr<Object> object) {
    Handle h{detail::next_handle<Handle>.fetch_add(1, std::memory_order_relaxed)};
    std::lock_guard<std::mutex> lock(mutex_);
    objects_.emplace(h.value, std::move(object));
    return h;
  }
  // Keeps `object` under the driver's own handle `h`; a handle already in
  // the table is a std::logic_error (the driver gave one value twice).
  void add(Handle h, std::shared_ptr<Object> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!objects_.emplace(h.value, std::move(object)).second)
      throw std::logic_error(fmt::format("{}: {} {:#x} is in the table already", backend_,
                                         kind_, h.value));
  }

  // The object of `h`; a DriverError (invalid_code; without one a
  // ValueError) for a handle that names nothing, destroyed or never created. `device` >= 0 adds "of device N" to
  // the message, for tables kept per device.
  std::shared_ptr<Object> get(Handle h, std::string_view call, int device = -1) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(h.value);
    if (it == objects_.end()) unknown(h, call, device);
    return it->second;
  }
  // The object of `h`, or nullptr.
  std::shared_ptr<Object> find(Handle h) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(h.value);
    return it == objects_.end() ? nullptr : it->second;
  }

  // Takes `h` out of the table and returns its object (alive while the
  // caller or another thread holds it). `check(Object&)` runs first, under
  // the table's lock, and may throw to refuse: the handle then stays.
  template <class Check>
  std::shared_ptr<Object> remove(Handle h, std::string_view call, int device, Check&& check) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(h.value);
    if (it == objects_.end()) unknown(h, call, device);
    check(*it->second);
    std::shared_ptr<Object> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }
  std::shared_ptr<Object> remove(Handle h, std::string_view call, int device = -1) {
    return remove(h, call, device, [](const Object&) {});
  }

  // The live objects at one moment (for a device-wide synchronize).
  std::vector<std::shared_ptr<Object>> objects() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<Object>> out;
    out.reserve(objects_.size());
    for (const auto& kv : objects_) out.push_back(kv.second);
    return out;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return objects_.size();
  }
  // Drops every handle (a runtime's destructor); objects go with their last
  // holder.
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    objects_.clear();
  }

  std::string_view backend() const noexcept { return backend_; }

 private:
  [[noreturn]] void unknown(Handle h, std::string_view call, int device) const {
    std::string what = fmt::format("{} {:#x} is not a live {}", kind_, h.value, kind_);
    if (device >= 0) what += fmt::format(" of device {}", device);
    if (invalid_code_) throw DriverError(backend_, *invalid_code_, call, what);
    throw ValueError(backend_, fmt::format("{}: {}", call, what));
  }

  std::string_view backend_;
  std::string_view kind_;
  std::optional<std::int64_t> invalid_code_;
  mutable std::mutex mutex_;
  std::unordered_map<std::uintptr_t, std::shared_ptr<Object>> objects_;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
