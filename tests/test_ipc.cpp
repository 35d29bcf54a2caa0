// Inter-process memory and events (Note [Inter-process memory] in
// device/backend.hpp) through Backend<R> on simdev (Note [simdev
// inter-process memory]), across real processes: this test program starts
// itself again (/proc/self/exe, the hidden test "ipc peer process", its role
// in ACCELKIT_IPC_TEST_PEER) and drives that peer with one-line commands over
// two pipes. Covered: memory read and written both ways, in the direct and
// mapped host-access modes; a consumer's stream ordered after the exporter's
// record; the exporter exiting first (the consumer keeps its memory, new
// opens fail naming the pid, waits for an incomplete record fail instead of
// hanging); a consumer dying while it holds memory (the exporter frees it,
// the pages released once it is gone); every bad handle and pointer refused
// with the value named; the state usable after each failure; a runtime
// without the members refused by name.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>
#include <accelkit/detail/strings.hpp>

#include "minimal_runtime.hpp"
#include "simdev_runtime.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

using namespace accelkit;
using namespace accelkit_tests;
using Sim = simdev::SimRuntime;
using SimBackend = Backend<Sim>;

namespace {

constexpr int kPeerIn = 100;   // the peer's end of the command pipe
constexpr int kPeerOut = 101;  // the peer's end of the reply pipe
constexpr const char* kRole = "ACCELKIT_IPC_TEST_PEER";

simdev::Config sim_mode(HostAccessLevel access) {
  simdev::Config c = sim(2, 64);
  c.host_access = access;
  return c;
}

std::string hex(const std::array<std::uint8_t, 64>& bytes) {
  return accelkit::detail::to_hex(bytes.data(), bytes.size());
}
template <class H>
H unhex(const std::string& s) {
  H h;
  if (!accelkit::detail::from_hex(s, h.bytes.data(), h.bytes.size()))
    throw std::runtime_error("not the hexadecimal text of a handle: '" + s + "'");
  return h;
}

template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}

void fill(SimBackend& b, void* p, unsigned char value, std::size_t n) {
  std::vector<unsigned char> h(n, value);
  b.memcpy(0, p, h.data(), n, CopyKind::host_to_device);
}
// The first byte of [p, p + n) that is not `value`, as "at k: v", or "".
std::string differs(SimBackend& b, const void* p, unsigned char value, std::size_t n) {
  std::vector<unsigned char> h(n);
  b.memcpy(0, h.data(), p, n, CopyKind::device_to_host);
  for (std::size_t i = 0; i < n; ++i)
    if (h[i] != value) return fmt::format("at {}: {:#x}", i, h[i]);
  return {};
}

// This program again, as a peer process that answers commands.
class Peer {
 public:
  explicit Peer(HostAccessLevel access = HostAccessLevel::direct) {
    int to[2], from[2];
    REQUIRE(::pipe2(to, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(from, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to[0], kPeerIn);
    posix_spawn_file_actions_adddup2(&actions, from[1], kPeerOut);
    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, kRole, std::strlen(kRole)) != 0) env_text.emplace_back(*e);
    env_text.push_back(fmt::format("{}={}", kRole,
                                   access == HostAccessLevel::mapped ? "mapped" : "direct"));
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    char test[] = "ipc peer process";
    char* argv[] = {exe, test, nullptr};
    int rc = posix_spawn(&pid_, exe, &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(to[0]);
    ::close(from[1]);
    in_ = to[1];
    out_ = from[0];
    REQUIRE(rc == 0);
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    ::close(in_);
    ::close(out_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

  // Sends one command and returns the reply ("ok ..." or "err ...").
  std::string ask(const std::string& command) {
    std::string line = command + "\n";
    REQUIRE(::write(in_, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
    std::string reply;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (true) {
      pollfd p{out_, POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      until - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0 || ::poll(&p, 1, left) <= 0) FAIL("the peer did not answer '" << command << "'");
      char c;
      ssize_t n = ::read(out_, &c, 1);
      if (n <= 0) FAIL("the peer ended while answering '" << command << "' (" << reply << ")");
      if (c == '\n') break;
      reply += c;
    }
    return reply;
  }
  // ask(), requiring "ok": the rest of the reply.
  std::string ok(const std::string& command) {
    std::string reply = ask(command);
    INFO("command: " << command);
    REQUIRE(reply.rfind("ok", 0) == 0);
    return reply.size() > 3 ? reply.substr(3) : std::string();
  }
  // Ends the peer at once (_exit: nothing closed or freed) and reaps it.
  void exit_now() {
    ask("exit");
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
};

// The peer's side: a simdev backend of its own and a loop of commands.
[[noreturn]] void serve(HostAccessLevel access) {
  SimBackend b(Environment::fixed({}), sim_mode(access));
  std::vector<void*> opened, own;
  std::vector<EventHandle> events;
  StreamHandle stream{}, held{};
  std::shared_ptr<Sim::Gate> gate;
  void* pinned = nullptr;
  std::size_t pinned_bytes = 0;
  FILE* in = ::fdopen(kPeerIn, "r");
  auto reply = [](std::string line) {
    for (char& c : line)
      if (c == '\n') c = ' ';
    line += '\n';
    if (::write(kPeerOut, line.data(), line.size()) < 0) ::_exit(3);
  };
  char buf[512];
  while (in && std::fgets(buf, sizeof buf, in)) {
    std::istringstream cmd(buf);
    std::string op;
    cmd >> op;
    try {
      if (op == "exit") {
        reply("ok");
        ::_exit(0);
      } else if (op == "open") {
        std::string h;
        cmd >> h;
        opened.push_back(b.ipc_mem_open(0, unhex<IpcMemHandle>(h)));
        reply(fmt::format("ok {}", opened.size() - 1));
      } else if (op == "check" || op == "fill") {
        std::size_t i, n;
        unsigned value;
        cmd >> i >> value >> n;
        if (op == "fill") {
          fill(b, opened.at(i), static_cast<unsigned char>(value), n);
          reply("ok");
        } else {
          std::string bad = differs(b, opened.at(i), static_cast<unsigned char>(value), n);
          reply(bad.empty() ? "ok" : "err " + bad);
        }
      } else if (op == "close" || op == "free_opened") {
        std::size_t i;
        cmd >> i;
        if (op == "close")
          b.ipc_mem_close(0, opened.at(i));
        else
          b.raw_free(0, opened.at(i), 4096);
        reply("ok");
      } else if (op == "open_event") {
        std::string h;
        cmd >> h;
        events.push_back(b.ipc_event_open(0, unhex<IpcEventHandle>(h)));
        reply(fmt::format("ok {}", events.size() - 1));
      } else if (op == "record") {
        std::size_t j;
        cmd >> j;
        if (!stream) stream = b.stream_create(0, 0);
        b.event_record(0, events.at(j), stream);
        reply("ok");
      } else if (op == "wait_copy") {  // the stream waits for event j, then copies opened[i]
        std::size_t j, i, n;
        cmd >> j >> i >> n;
        if (!stream) stream = b.stream_create(0, 0);
        if (pinned_bytes < n) {
          pinned = b.raw_host_malloc(0, n);
          pinned_bytes = n;
        }
        std::memset(pinned, 0, n);
        b.stream_wait_event(0, stream, events.at(j));
        b.memcpy_async(0, pinned, opened.at(i), n, CopyKind::device_to_host, stream, true);
        reply("ok");
      } else if (op == "sync_check") {
        unsigned value;
        std::size_t n;
        cmd >> value >> n;
        b.stream_synchronize(0, stream);
        const auto* p = static_cast<const unsigned char*>(pinned);
        std::string bad;
        for (std::size_t k = 0; k < n && bad.empty(); ++k)
          if (p[k] != value) bad = fmt::format("at {}: {:#x}", k, p[k]);
        reply(bad.empty() ? "ok" : "err " + bad);
      } else if (op == "query") {
        std::size_t j;
        cmd >> j;
        reply(fmt::format("ok {}", b.event_query(0, events.at(j)) ? 1 : 0));
      } else if (op == "event_sync") {
        std::size_t j;
        cmd >> j;
        b.event_synchronize(0, events.at(j));
        reply("ok");
      } else if (op == "destroy_event") {
        std::size_t j;
        cmd >> j;
        b.event_destroy(0, events.at(j));
        reply("ok");
      } else if (op == "counts") {
        reply(fmt::format("ok {} {}", b.runtime().ipc_open_count(),
                          b.runtime().ipc_events_open()));
      } else if (op == "export") {  // n bytes filled with `value`
        unsigned value;
        std::size_t n;
        cmd >> value >> n;
        own.push_back(b.raw_malloc(0, n));
        fill(b, own.back(), static_cast<unsigned char>(value), n);
        reply("ok " + hex(b.ipc_mem_export(0, own.back()).bytes));
      } else if (op == "export_held_event") {  // recorded behind a gate never opened
        held = b.stream_create(0, 0);
        gate = b.runtime().hold(b.physical(0), held);
        EventHandle e = b.event_create(0, EventFlags::interprocess);
        b.event_record(0, e, held);
        reply("ok " + hex(b.ipc_event_export(0, e).bytes));
      } else {
        reply("err unknown command " + op);
      }
    } catch (const std::exception& e) {
      reply(std::string("err ") + e.what());
    }
  }
  ::_exit(0);
}

}  // namespace

// Not a test of its own: the peer process the tests below start.
TEST_CASE("ipc peer process", "[.peer]") {
  const char* role = std::getenv(kRole);
  if (role == nullptr) return;
  serve(std::string(role) == "mapped" ? HostAccessLevel::mapped : HostAccessLevel::direct);
}

TEST_CASE("ipc: simdev has both groups; a runtime without them is refused by name") {
  STATIC_REQUIRE(SimBackend::has_ipc_memory);
  STATIC_REQUIRE(SimBackend::has_ipc_events);
  using MinimalBackend = Backend<minimal::MinimalRuntime>;
  STATIC_REQUIRE_FALSE(MinimalBackend::has_ipc_memory);
  STATIC_REQUIRE_FALSE(MinimalBackend::has_ipc_events);
  MinimalBackend m(Environment::fixed({}));
  std::string e = thrown<NotSupportedError>([&] { m.ipc_mem_export(0, &m); });
  CHECK(contains(e, "minimal"));
  CHECK(contains(e, "ipc_mem_export, ipc_mem_open and ipc_mem_close"));
  e = thrown<NotSupportedError>([&] { m.ipc_event_open(0, IpcEventHandle{}); });
  CHECK(contains(e, "ipc_event_export and ipc_event_open"));
  CHECK(contains(thrown<IndexError>([&] { m.ipc_mem_open(5, IpcMemHandle{}); }), "5"));
}

TEST_CASE("ipc: memory exported here is read and written by another process, both ways") {
  for (HostAccessLevel access : {HostAccessLevel::direct, HostAccessLevel::mapped}) {
    INFO("host access " << to_string(access));
    SimBackend b(Environment::fixed({}), sim_mode(access));
    constexpr std::size_t n = (1u << 20) + 512;
    void* p = b.raw_malloc(0, n);
    fill(b, p, 0x11, n);
    IpcMemHandle h = b.ipc_mem_export(0, p);
    CHECK(b.ipc_mem_export(0, p) == h);  // the same memory, the same handle
    CHECK(b.runtime().ipc_exported() == 1);
    {
      Peer peer(access);
      CHECK(peer.ok("open " + hex(h.bytes)) == "0");
      CHECK(peer.ok("counts") == "1 0");
      peer.ok(fmt::format("check 0 {} {}", 0x11, n));
      peer.ok(fmt::format("fill 0 {} {}", 0x22, n));
      CHECK(differs(b, p, 0x22, n).empty());  // the peer's write, in this process
      fill(b, p, 0x33, 4096);
      peer.ok(fmt::format("check 0 {} {}", 0x33, 4096));  // and this one's, there
      peer.ok("close 0");
      CHECK(peer.ok("counts") == "0 0");
    }
    b.raw_free(0, p, n);
    CHECK(b.runtime().ipc_exported() == 0);
    CHECK(b.runtime().ipc_deferred_releases() == 0);
    CHECK(b.runtime().bytes_in_use(0) == 0);
  }
}

TEST_CASE("ipc: another process's stream waits for this process's record of an interprocess event") {
  SimBackend b(Environment::fixed({}), sim(2, 64));
  constexpr std::size_t n = 1u << 16;
  void* p = b.raw_malloc(0, n);
  fill(b, p, 0x01, n);
  StreamHandle s = b.stream_create(0, 0);
  std::shared_ptr<Sim::Gate> gate = b.runtime().hold(b.physical(0), s);
  b.memset_async(0, p, 0x5a, n, s);  // behind the gate
  EventHandle e = b.event_create(0, EventFlags::interprocess);
  b.event_record(0, e, s);
  IpcEventHandle eh = b.ipc_event_export(0, e);
  CHECK(b.ipc_event_export(0, e) == eh);
  CHECK(b.runtime().ipc_events_exported() == 1);
  Peer peer;
  peer.ok("open " + hex(b.ipc_mem_export(0, p).bytes));
  CHECK(peer.ok("open_event " + hex(eh.bytes)) == "0");
  peer.ok(fmt::format("wait_copy 0 0 {}", n));
  CHECK(peer.ok("query 0") == "0");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(peer.ok("query 0") == "0");  // still held here: the peer's copy has not run
  gate->open();
  peer.ok(fmt::format("sync_check {} {}", 0x5a, n));  // it ran after the memset
  CHECK(peer.ok("query 0") == "1");
  peer.ok("event_sync 0");
  CHECK(contains(peer.ask("record 0"), "only its exporter records it"));
  // A new record here is what the next wait there follows.
  gate = b.runtime().hold(b.physical(0), s);
  b.memset_async(0, p, 0x6b, n, s);
  b.event_record(0, e, s);
  CHECK(peer.ok("query 0") == "0");
  peer.ok(fmt::format("wait_copy 0 0 {}", n));
  gate->open();
  peer.ok(fmt::format("sync_check {} {}", 0x6b, n));
  peer.ok("destroy_event 0");
  CHECK(peer.ok("counts") == "1 0");
  peer.ok("close 0");
  b.stream_synchronize(0, s);
  b.event_destroy(0, e);
  CHECK(b.runtime().ipc_events_exported() == 0);
  b.raw_free(0, p, n);
  b.stream_destroy(0, s);
}

TEST_CASE("ipc: memory opened stays valid after its exporter exits; new opens and waits fail naming it") {
  SimBackend b(Environment::fixed({}), sim(2, 64));
  Peer peer;
  pid_t pid = peer.pid();
  auto first = unhex<IpcMemHandle>(peer.ok(fmt::format("export {} {}", 0x33, 8192)));
  auto second = unhex<IpcMemHandle>(peer.ok(fmt::format("export {} {}", 0x44, 4096)));
  auto event = unhex<IpcEventHandle>(peer.ok("export_held_event"));
  void* p = b.ipc_mem_open(0, first);
  CHECK(b.runtime().ipc_open_count() == 1);
  EventHandle e = b.ipc_event_open(0, event);
  CHECK_FALSE(b.event_query(0, e));
  StreamHandle s = b.stream_create(0, 0);
  b.stream_wait_event(0, s, e);  // for a record that never completes there
  peer.exit_now();

  CHECK(differs(b, p, 0x33, 8192).empty());  // the memory outlives its exporter
  fill(b, p, 0x35, 8192);
  CHECK(differs(b, p, 0x35, 8192).empty());
  std::string pid_text = fmt::format("pid {}", pid);
  std::string err = thrown<DriverError>([&] { b.ipc_mem_open(0, second); });
  CHECK(contains(err, "has exited"));
  CHECK(contains(err, pid_text));
  CHECK(contains(err, hex(second.bytes)));
  err = thrown<DriverError>([&] { b.stream_synchronize(0, s); });  // not a hang
  CHECK(contains(err, "exited before its record 1 completed"));
  CHECK(contains(err, pid_text));
  CHECK(contains(thrown<DriverError>([&] { b.event_synchronize(0, e); }), pid_text));
  CHECK(contains(thrown<DriverError>([&] { b.event_query(0, e); }), pid_text));
  CHECK(contains(thrown<DriverError>([&] { b.ipc_event_open(0, event); }), "has exited"));
  b.stream_synchronize(0, s);  // usable again
  b.event_destroy(0, e);
  b.ipc_mem_close(0, p);
  CHECK(b.runtime().ipc_open_count() == 0);
  CHECK(b.runtime().ipc_events_open() == 0);
  b.stream_destroy(0, s);
}

TEST_CASE("ipc: a consumer that dies holding memory does not keep the exporter from freeing it") {
  SimBackend b(Environment::fixed({}), sim(2, 64));
  constexpr std::size_t n = 3 * 4096;
  void* p = b.raw_malloc(0, n);
  fill(b, p, 0x11, n);
  IpcMemHandle h = b.ipc_mem_export(0, p);
  {
    Peer peer;
    peer.ok("open " + hex(h.bytes));
    CHECK(contains(peer.ask("open " + hex(h.bytes)), "open in this process already"));
    b.raw_free(0, p, n);  // while the peer holds it
    CHECK(b.runtime().ipc_deferred_releases() == 1);
    CHECK(b.runtime().bytes_in_use(0) == 0);
    peer.ok(fmt::format("check 0 {} {}", 0x11, n));  // still its memory there
    peer.exit_now();  // dies without closing
  }
  b.raw_free(0, b.raw_malloc(0, 4096), 4096);  // the next malloc sees the holder gone
  CHECK(b.runtime().ipc_deferred_releases() == 0);
  Peer late;
  std::string err = late.ask("open " + hex(h.bytes));
  CHECK(contains(err, "freed by process"));
  CHECK(contains(err, hex(h.bytes)));
  CHECK(late.ok("counts") == "0 0");
}

TEST_CASE("ipc: bad handles and pointers are refused naming the value, the state usable after") {
  SimBackend b(Environment::fixed({}), sim(2, 64));
  void* p = b.raw_malloc(0, 8192);
  IpcMemHandle h = b.ipc_mem_export(0, p);
  auto code = [](auto&& f) { return driver_code(f); };

  // Opened in the process that exported it.
  std::string err = thrown<DriverError>([&] { b.ipc_mem_open(0, h); });
  CHECK(contains(err, "exported by this process"));
  CHECK(contains(err, hex(h.bytes)));
  // On another device than the exporter's.
  CHECK(contains(thrown<DriverError>([&] { b.ipc_mem_open(1, h); }), "opened on device 1"));
  // Garbled, or no handle at all.
  IpcMemHandle garbled = h;
  garbled.bytes[20] ^= 0x40;
  err = thrown<DriverError>([&] { b.ipc_mem_open(0, garbled); });
  CHECK(contains(err, "is not a simdev memory handle"));
  CHECK(contains(err, hex(garbled.bytes)));
  CHECK(code([&] { b.ipc_mem_open(0, IpcMemHandle{}); }) == simdev::kInvalidValue);
  IpcEventHandle as_event;
  as_event.bytes = h.bytes;
  CHECK(contains(thrown<DriverError>([&] { b.ipc_event_open(0, as_event); }),
                 "is not a simdev event handle"));
  // Export of what is not the start of an allocation, or not malloc's.
  void* inside = static_cast<char*>(p) + 256;
  err = thrown<DriverError>([&] { b.ipc_mem_export(0, inside); });
  CHECK(contains(err, fmt::format("{} lies inside the allocation at {}", inside, p)));
  int local = 0;
  CHECK(contains(thrown<DriverError>([&] { b.ipc_mem_export(0, &local); }),
                 "is not the start of an allocation from malloc"));
  constexpr std::size_t kG = std::size_t{2} << 20;
  void* range = b.vm_reserve(0, kG);
  PhysicalHandle phys = b.vm_create(0, kG);
  b.vm_map(0, range, kG, phys);
  CHECK(contains(thrown<DriverError>([&] { b.ipc_mem_export(0, range); }),
                 "is not the start of an allocation from malloc"));
  b.vm_unmap(0, range, kG);
  b.vm_destroy(0, phys);
  b.vm_release(0, range, kG);
  CHECK(contains(thrown<ValueError>([&] { b.ipc_mem_export(0, nullptr); }), "null pointer"));
  // Close of what is not open.
  CHECK(contains(thrown<DriverError>([&] { b.ipc_mem_close(0, p); }),
                 "own allocation: free it"));
  CHECK(contains(thrown<DriverError>([&] { b.ipc_mem_close(0, &local); }),
                 fmt::format("pointer {} is not memory opened", static_cast<void*>(&local))));
  CHECK(contains(thrown<IndexError>([&] { b.ipc_mem_close(7, p); }), "7"));

  // Events: the flag, timing, the process, garbled handles.
  EventHandle plain = b.event_create(0, EventFlags::none);
  err = thrown<DriverError>([&] { b.ipc_event_export(0, plain); });
  CHECK(contains(err, fmt::format("event {:#x} was not created with EventFlags::interprocess",
                                  plain.value)));
  CHECK(contains(thrown<DriverError>([&] {
                   b.event_create(0, EventFlags::interprocess | EventFlags::timing);
                 }),
                 "cannot be a timing event"));
  EventHandle shared = b.event_create(0, EventFlags::interprocess);
  IpcEventHandle eh = b.ipc_event_export(0, shared);
  CHECK(contains(thrown<DriverError>([&] { b.ipc_event_open(0, eh); }),
                 "exported by this process"));
  IpcEventHandle bad = eh;
  bad.bytes[33] ^= 1;
  CHECK(contains(thrown<DriverError>([&] { b.ipc_event_open(0, bad); }), hex(bad.bytes)));
  CHECK(contains(thrown<ValueError>([&] { b.ipc_event_export(0, EventHandle{}); }),
                 "null event"));

  {
    Peer peer;
    peer.ok("open " + hex(h.bytes));
    err = peer.ask("free_opened 0");
    CHECK(contains(err, "was opened from process"));
    CHECK(contains(err, "ipc_mem_close"));
    peer.ok("close 0");
    CHECK(contains(peer.ask("close 0"), "never opened, or closed already"));
    peer.ok("open " + hex(h.bytes));  // open again after a close: fine
    CHECK(peer.ok("open_event " + hex(eh.bytes)) == "0");
    CHECK(peer.ok("open_event " + hex(eh.bytes)) == "1");  // an event opens many times
    CHECK(peer.ok("counts") == "1 2");
    b.event_destroy(0, shared);  // opens from now on are refused
    CHECK(contains(peer.ask("open_event " + hex(eh.bytes)), "destroyed by its exporter"));
    CHECK(peer.ok("query 0") == "1");  // never recorded: complete
  }

  // Injected faults fail once, then the member works.
  b.runtime().inject_fault("ipc_mem_export");
  CHECK(code([&] { b.ipc_mem_export(0, p); }) == simdev::kInjectedFault);
  CHECK(b.ipc_mem_export(0, p) == h);
  b.runtime().inject_fault("ipc_event_export");
  EventHandle again = b.event_create(0, EventFlags::interprocess);
  CHECK(code([&] { b.ipc_event_export(0, again); }) == simdev::kInjectedFault);
  b.ipc_event_export(0, again);
  b.event_destroy(0, again);
  b.event_destroy(0, plain);
  b.raw_free(0, p, 8192);
  CHECK(b.runtime().ipc_exported() == 0);
  CHECK(b.runtime().ipc_events_exported() == 0);
  CHECK(b.runtime().bytes_in_use(0) == 0);
}
