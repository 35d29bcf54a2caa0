// accelkit/support: reference counts across processes, for memory that one
// process (the producer) shares with others (Note [Sharing device memory
// between processes] in torch/ipc.hpp). Linux (memfd, open file description
// locks); includes no PyTorch header.
//
//   // producer                               // consumer, given {pid, fd, slot}
//   RefFile file("simdev");                   RefFileView view("simdev", pid, fd);
//   auto slot = file.acquire();  // pending 1 view.hold(slot);   // lock, then pending - 1
//   ... send {getpid(), file.fd(), *slot}     ... use the memory ...
//   file.released(*slot);  // false           view.drop(slot);   // unlock
//   file.released(*slot);  // true: free it, file.free_slot(*slot)
//
// A slot is an 8-byte pending counter in a shared file the producer made
// (memfd_create) and byte `slot` of that file as a lock. The producer adds
// one pending open per send; a consumer opens the file through
// /proc/<pid>/fd/<fd> (a new open file description of its own), takes an
// OFD read lock on the slot's byte, then takes one off the pending count.
// The slot is released when the count is 0 and no process holds the lock:
// the kernel drops the locks of a process that exits or dies, so a consumer
// that dies releases what it held. Errors: RuntimeError naming the backend
// and the value (a producer that has exited: its pid).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

// The slots of a reference file, and so its size (8 bytes a slot).
inline constexpr std::uint32_t kRefSlots = 4096;

namespace detail_refs {

inline std::string errno_text(int e) { return std::strerror(e); }

// Whether process `pid` exists (it may be a zombie).
inline bool process_alive(int pid) noexcept {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

// An OFD lock request on byte `slot`.
inline struct flock byte_lock(short type, std::uint32_t slot) noexcept {
  struct flock l;
  std::memset(&l, 0, sizeof l);
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = static_cast<off_t>(slot);
  l.l_len = 1;
  l.l_pid = 0;  // required 0 for OFD locks
  return l;
}

inline std::atomic<std::uint64_t>* counters(void* map) noexcept {
  return static_cast<std::atomic<std::uint64_t>*>(map);
}

inline void* map_file(std::string_view backend, int fd, std::string_view what) {
  void* p = ::mmap(nullptr, kRefSlots * sizeof(std::uint64_t), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    throw RuntimeError(backend, fmt::format("cannot map {}: {}", what, errno_text(errno)));
  return p;
}

}  // namespace detail_refs

// The producer's file of slots. Not thread-safe: its owner serializes the
// calls (the consumers' side is other processes).
class RefFile {
 public:
  explicit RefFile(std::string_view backend) : backend_(backend) {
    fd_ = ::memfd_create(fmt::format("{}-ipc-refs", backend).c_str(), MFD_CLOEXEC);
    if (fd_ < 0)
      throw RuntimeError(backend, fmt::format("cannot create a reference file for shared "
                                              "memory (memfd_create: {})",
                                              detail_refs::errno_text(errno)));
    if (::ftruncate(fd_, static_cast<off_t>(kRefSlots * sizeof(std::uint64_t))) != 0) {
      int e = errno;
      ::close(fd_);
      throw RuntimeError(backend, fmt::format("cannot size a reference file for shared memory "
                                              "({} bytes: {})",
                                              kRefSlots * sizeof(std::uint64_t),
                                              detail_refs::errno_text(e)));
    }
    try {
      map_ = detail_refs::map_file(backend, fd_, "a reference file for shared memory");
    } catch (...) {
      ::close(fd_);
      throw;
    }
    free_.reserve(kRefSlots);
    for (std::uint32_t s = kRefSlots; s > 0; --s) free_.push_back(s - 1);
  }
  RefFile(const RefFile&) = delete;
  RefFile& operator=(const RefFile&) = delete;
  ~RefFile() {
    ::munmap(map_, kRefSlots * sizeof(std::uint64_t));
    ::close(fd_);
  }

  // The descriptor a consumer opens as /proc/<pid>/fd/<fd>.
  int fd() const noexcept { return fd_; }
  // Slots acquired and not freed.
  std::uint32_t used() const noexcept {
    return kRefSlots - static_cast<std::uint32_t>(free_.size());
  }

  // A free slot with one pending open; nullopt when every slot is used.
  std::optional<std::uint32_t> acquire() {
    if (free_.empty()) return std::nullopt;
    std::uint32_t s = free_.back();
    free_.pop_back();
    counter(s).store(1);
    return s;
  }
  // One more pending open of `slot` (the same memory sent again).
  void add_pending(std::uint32_t slot) noexcept { counter(slot).fetch_add(1); }
  // One pending open of `slot` fewer (a send that failed before it left).
  void take_back(std::uint32_t slot) noexcept {
    std::uint64_t v = counter(slot).load();
    while (v > 0 && !counter(slot).compare_exchange_weak(v, v - 1)) {
    }
  }
  std::uint64_t pending(std::uint32_t slot) const noexcept { return counter(slot).load(); }

  // Whether no open of `slot` is pending and no process holds its lock.
  // The count is read before the lock: a consumer locks before it takes its
  // open off the count, so a count of 0 means every lock taken is visible.
  bool released(std::uint32_t slot) const {
    if (counter(slot).load() != 0) return false;
    struct flock l = detail_refs::byte_lock(F_WRLCK, slot);
    if (::fcntl(fd_, F_OFD_GETLK, &l) != 0)
      throw RuntimeError(backend_, fmt::format("cannot query the lock of reference slot {} "
                                               "(F_OFD_GETLK: {})",
                                               slot, detail_refs::errno_text(errno)));
    return l.l_type == F_UNLCK;
  }
  // Returns `slot` for reuse (released() was true).
  void free_slot(std::uint32_t slot) {
    counter(slot).store(0);
    free_.push_back(slot);
  }

 private:
  std::atomic<std::uint64_t>& counter(std::uint32_t slot) const noexcept {
    return detail_refs::counters(map_)[slot];
  }

  std::string backend_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::vector<std::uint32_t> free_;
};

// A producer's reference file, opened by a consumer. Not thread-safe: its
// owner serializes the calls.
class RefFileView {
 public:
  RefFileView(std::string_view backend, int pid, int fd) : backend_(backend), pid_(pid) {
    std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) {
      int e = errno;
      if (!detail_refs::process_alive(pid))
        throw RuntimeError(backend, fmt::format("the process that shared this memory (pid {}) "
                                                "has exited; its memory cannot be opened",
                                                pid));
      throw RuntimeError(backend, fmt::format("cannot open the reference file of process {} "
                                              "({}: {})",
                                              pid, path, detail_refs::errno_text(e)));
    }
    struct stat st;
    if (::fstat(fd_, &st) != 0 ||
        st.st_size != static_cast<off_t>(kRefSlots * sizeof(std::uint64_t))) {
      ::close(fd_);
      throw RuntimeError(backend, fmt::format("{} of process {} is not a reference file of "
                                              "shared memory",
                                              path, pid));
    }
    try {
      map_ = detail_refs::map_file(backend, fd_, path);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  RefFileView(const RefFileView&) = delete;
  RefFileView& operator=(const RefFileView&) = delete;
  // Closing the description drops every lock it holds.
  ~RefFileView() {
    ::munmap(map_, kRefSlots * sizeof(std::uint64_t));
    ::close(fd_);
  }

  int pid() const noexcept { return pid_; }

  // Holds `slot` for this process (its read lock, counted), then takes one
  // pending open off its count.
  void hold(std::uint32_t slot) {
    check(slot);
    int& n = held_[slot];
    if (n == 0) {
      struct flock l = detail_refs::byte_lock(F_RDLCK, slot);
      if (::fcntl(fd_, F_OFD_SETLK, &l) != 0) {
        int e = errno;
        held_.erase(slot);
        throw RuntimeError(backend_, fmt::format("cannot lock reference slot {} of process {} "
                                                 "(F_OFD_SETLK: {})",
                                                 slot, pid_, detail_refs::errno_text(e)));
      }
    }
    ++n;
    take_pending(slot);
  }
  // Takes one pending open off `slot`'s count without holding it (the
  // memory was sent again to a process that still holds it).
  void take_pending(std::uint32_t slot) {
    check(slot);
    std::atomic<std::uint64_t>& c = detail_refs::counters(map_)[slot];
    std::uint64_t v = c.load();
    while (v > 0 && !c.compare_exchange_weak(v, v - 1)) {
    }
  }
  // Drops one hold of `slot`; the last unlocks it.
  void drop(std::uint32_t slot) {
    auto it = held_.find(slot);
    if (it == held_.end()) return;
    if (--it->second > 0) return;
    held_.erase(it);
    struct flock l = detail_refs::byte_lock(F_UNLCK, slot);
    if (::fcntl(fd_, F_OFD_SETLK, &l) != 0)
      throw RuntimeError(backend_, fmt::format("cannot unlock reference slot {} of process {} "
                                               "(F_OFD_SETLK: {})",
                                               slot, pid_, detail_refs::errno_text(errno)));
  }
  // Whether this process holds no slot of the file.
  bool idle() const noexcept { return held_.empty(); }

 private:
  void check(std::uint32_t slot) const {
    if (slot >= kRefSlots)
      throw RuntimeError(backend_, fmt::format("reference slot {} of process {} is out of range "
                                               "(a file has {})",
                                               slot, pid_, kRefSlots));
  }

  std::string backend_;
  int pid_ = 0;
  int fd_ = -1;
  void* map_ = nullptr;
  std::unordered_map<std::uint32_t, int> held_;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
