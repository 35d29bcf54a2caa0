// include/accelkit/support/ipc_refs.hpp on its own: a producer's reference
// file and the consumers that hold its slots, each consumer a child process
// (fork) that opens the file through /proc/<pid>/fd/<fd>. And what sharing
// asks of the caching allocator: the segment of a pointer, and reclaimers
// run before out of memory (Note [Sharing device memory between processes]).
#include "catch.hpp"

#include <accelkit/accelkit.hpp>
#include <accelkit/support/ipc_refs.hpp>

#include "simdev_runtime.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

using accelkit::RuntimeError;
using accelkit::support::kRefSlots;
using accelkit::support::RefFile;
using accelkit::support::RefFileView;

namespace {

// A consumer in a child process: opens the producer's file, holds `slot`
// (`holds` times), reports on `ready`, then waits for one byte on `go`:
// 'd' drops its holds and exits, 'x' exits holding them (the kernel drops
// the locks), 'p' takes a pending open off without holding and exits.
struct Child {
  pid_t pid = -1;
  int go = -1;     // parent writes
  int ready = -1;  // parent reads

  static Child start(int producer, int fd, std::uint32_t slot, int holds) {
    int to_child[2], to_parent[2];
    REQUIRE(::pipe(to_child) == 0);
    REQUIRE(::pipe(to_parent) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(to_child[1]);
      ::close(to_parent[0]);
      char status = 'k';
      char cmd = 0;
      try {
        RefFileView view("test", producer, fd);
        for (int i = 0; i < holds; ++i) view.hold(slot);
        if (::write(to_parent[1], &status, 1) != 1) ::_exit(3);
        if (::read(to_child[0], &cmd, 1) != 1) ::_exit(4);
        if (cmd == 'x') ::_exit(0);
        if (cmd == 'p') {
          view.take_pending(slot);
          ::_exit(0);
        }
        for (int i = 0; i < holds; ++i) {
          view.drop(slot);
          char step = view.idle() ? 'i' : 'h';
          if (::write(to_parent[1], &step, 1) != 1) ::_exit(3);
          if (i + 1 < holds && ::read(to_child[0], &cmd, 1) != 1) ::_exit(4);
        }
        if (::read(to_child[0], &cmd, 1) != 1) ::_exit(4);
        ::_exit(0);
      } catch (...) {
        status = 'e';
        if (::write(to_parent[1], &status, 1) != 1) ::_exit(3);
        ::_exit(2);
      }
    }
    ::close(to_child[0]);
    ::close(to_parent[1]);
    Child c;
    c.pid = pid;
    c.go = to_child[1];
    c.ready = to_parent[0];
    return c;
  }
  char next() const {
    char c = 0;
    REQUIRE(::read(ready, &c, 1) == 1);
    return c;
  }
  void send(char c) const { REQUIRE(::write(go, &c, 1) == 1); }
  int wait() {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    ::close(go);
    ::close(ready);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

}  // namespace

TEST_CASE("ipc refs: a slot is released once its pending open is taken and its holder drops it") {
  RefFile file("test");
  std::optional<std::uint32_t> slot = file.acquire();
  REQUIRE(slot);
  CHECK(file.used() == 1);
  CHECK(file.pending(*slot) == 1);
  CHECK_FALSE(file.released(*slot));  // sent, not opened yet

  Child c = Child::start(::getpid(), file.fd(), *slot, 2);
  REQUIRE(c.next() == 'k');
  CHECK(file.pending(*slot) == 0);    // both holds took one off; the count stops at 0
  CHECK_FALSE(file.released(*slot));  // the child holds the lock
  c.send('d');
  CHECK(c.next() == 'h');             // one hold of two dropped: still locked
  CHECK_FALSE(file.released(*slot));
  c.send('d');
  CHECK(c.next() == 'i');
  CHECK(file.released(*slot));        // unlocked while the child still lives
  c.send('q');
  CHECK(c.wait() == 0);

  file.free_slot(*slot);
  CHECK(file.used() == 0);
}

TEST_CASE("ipc refs: a consumer that dies holding a slot releases it") {
  RefFile file("test");
  std::uint32_t slot = *file.acquire();
  Child c = Child::start(::getpid(), file.fd(), slot, 1);
  REQUIRE(c.next() == 'k');
  CHECK_FALSE(file.released(slot));
  c.send('x');  // exits without dropping
  CHECK(c.wait() == 0);
  CHECK(file.released(slot));
}

TEST_CASE("ipc refs: a second send is pending until the holder takes it off") {
  RefFile file("test");
  std::uint32_t slot = *file.acquire();
  Child holder = Child::start(::getpid(), file.fd(), slot, 1);
  REQUIRE(holder.next() == 'k');
  file.add_pending(slot);  // the same memory sent again
  CHECK(file.pending(slot) == 1);
  Child again = Child::start(::getpid(), file.fd(), slot, 0);
  REQUIRE(again.next() == 'k');
  again.send('p');  // the receiver found it cached: only the count
  CHECK(again.wait() == 0);
  CHECK(file.pending(slot) == 0);
  CHECK_FALSE(file.released(slot));  // the holder still holds it
  holder.send('x');
  CHECK(holder.wait() == 0);
  CHECK(file.released(slot));
}

TEST_CASE("ipc refs: two slots of one file are independent") {
  RefFile file("test");
  std::uint32_t a = *file.acquire(), b = *file.acquire();
  CHECK(a != b);
  Child c = Child::start(::getpid(), file.fd(), a, 1);
  REQUIRE(c.next() == 'k');
  CHECK_FALSE(file.released(a));
  CHECK_FALSE(file.released(b));  // b's open is still pending
  file.free_slot(b);              // as the producer does after its own check
  c.send('x');
  CHECK(c.wait() == 0);
  CHECK(file.released(a));
}

TEST_CASE("ipc refs: every slot of a file can be used, then none, then a freed one again") {
  RefFile file("test");
  std::uint32_t last = 0;
  for (std::uint32_t i = 0; i < kRefSlots; ++i) {
    std::optional<std::uint32_t> s = file.acquire();
    REQUIRE(s);
    last = *s;
  }
  CHECK(file.used() == kRefSlots);
  CHECK_FALSE(file.acquire());
  file.free_slot(last);
  std::optional<std::uint32_t> again = file.acquire();
  REQUIRE(again);
  CHECK(*again == last);
  CHECK(file.pending(*again) == 1);
}

TEST_CASE("ipc refs: opening the file of a process that has exited names its pid") {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  std::string what;
  try {
    RefFileView view("test", pid, 3);
  } catch (const RuntimeError& e) {
    what = e.what();
  }
  CHECK(what.find("test: ") == 0);
  CHECK(what.find("pid " + std::to_string(pid)) != std::string::npos);
  CHECK(what.find("has exited") != std::string::npos);
}

TEST_CASE("ipc refs: a descriptor that is not a reference file is refused") {
  int fd = ::open("/dev/null", O_RDONLY);
  REQUIRE(fd >= 0);
  std::string what;
  try {
    RefFileView view("test", ::getpid(), fd);
  } catch (const RuntimeError& e) {
    what = e.what();
  }
  ::close(fd);
  CHECK(what.find("is not a reference file") != std::string::npos);
}

TEST_CASE("ipc refs: a slot out of range is refused with its value") {
  RefFile file("test");
  RefFileView view("test", ::getpid(), file.fd());
  std::string what;
  try {
    view.hold(kRefSlots);
  } catch (const RuntimeError& e) {
    what = e.what();
  }
  CHECK(what.find("slot " + std::to_string(kRefSlots)) != std::string::npos);
  CHECK(view.idle());
}

namespace {
simdev::Config one_device(std::uint64_t mib) {
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {mib << 20};
  return c;
}
accelkit::AllocatorConfig alloc_conf(const std::string& text) {
  return accelkit::AllocatorConfig::parse("simdev", "SIMDEV_ALLOC_CONF", text);
}
}  // namespace

TEST_CASE("ipc refs: segment_of names the driver allocation that holds a pointer") {
  using accelkit::memory_constants::kMiB;
  accelkit::Backend<simdev::SimRuntime> b(accelkit::Environment::fixed({}), one_device(64));
  accelkit::DeviceCachingAllocator<simdev::SimRuntime> a(b, 0, alloc_conf(""));
  accelkit::StreamHandle s = b.stream_create(0, 0);
  char* p = static_cast<char*>(a.allocate(1000, s));  // a small segment of 2 MiB
  char* q = static_cast<char*>(a.allocate(1000, s));
  accelkit::SegmentSpan sp = a.segment_of(p), sq = a.segment_of(q + 10);
  REQUIRE(sp.base != nullptr);
  CHECK(sp.base == sq.base);
  CHECK(sp.size == 2 * kMiB);
  CHECK(p >= sp.base);
  CHECK(p < sp.base + sp.size);
  CHECK_FALSE(sp.expandable);
  char* big = static_cast<char*>(a.allocate(12 * kMiB, s));  // a large segment of its own
  accelkit::SegmentSpan sb = a.segment_of(big + 5 * kMiB);
  CHECK(sb.base == big);
  CHECK(sb.size == 12 * kMiB);
  int local = 0;
  CHECK(a.segment_of(&local).base == nullptr);
  a.deallocate(p);
  a.deallocate(q);
  a.deallocate(big);
}

TEST_CASE("ipc refs: a reclaimer runs where the device has no room, before out of memory") {
  using accelkit::memory_constants::kMiB;
  accelkit::Backend<simdev::SimRuntime> b(accelkit::Environment::fixed({}), one_device(64));
  accelkit::DeviceCachingAllocator<simdev::SimRuntime> a(b, 0, alloc_conf(""));
  accelkit::StreamHandle s = b.stream_create(0, 0);
  void* kept = a.allocate(40 * kMiB, s);  // as memory a receiver held
  int calls = 0;
  a.attach_reclaimer([&] {
    ++calls;
    if (kept) a.deallocate(kept);  // every receiver released it
    kept = nullptr;
  });
  a.attach_reclaimer([] { throw std::runtime_error("dropped"); });
  void* small = a.allocate(1000, s);  // room: no reclaimer runs
  CHECK(calls == 0);
  void* p = a.allocate(50 * kMiB, s);  // room only once the reclaimer freed the 40 MiB
  CHECK(calls == 1);
  CHECK(p != nullptr);
  CHECK(kept == nullptr);
  CHECK_THROWS_AS(a.allocate(30 * kMiB, s), accelkit::OutOfMemoryError);  // nothing left
  CHECK(calls == 2);
  a.deallocate(p);
  a.deallocate(small);
}
