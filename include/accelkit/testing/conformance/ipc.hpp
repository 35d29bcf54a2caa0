// accelkit: the conformance kit's interprocess checks: device memory and
// events shared with another process (Note [Inter-process memory] in
// device/backend.hpp), between the kit's process, which exports, and a
// second process of the same program, which opens (Note [The kit's second
// process] in testing/conformance/peer.hpp). Included by
// testing/conformance.hpp, which registers them. A runtime without the
// members skips them, after the SDK's refusal is checked.
//
// What the checks hold a runtime to is what CUDA's cudaIpc* calls do:
// opening a handle in the process that exported it is refused (CUDA:
// "invalid device context"); a handle opened, closed and opened again maps
// the memory again; the exporter's memory is untouched by a close. What
// CUDA leaves undefined is not checked: memory used after its exporter
// freed it or exited, and a handle opened twice at once (CUDA counts the
// opens, simdev refuses the second; the SDK never does it).
#pragma once

#include <accelkit/testing/conformance/kit.hpp>
#include <accelkit/testing/conformance/peer.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct InterprocessChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::read;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;
  using Tools::no_host_side;
  static constexpr bool has_memory = Kit::SdkBackend::has_ipc_memory;
  static constexpr bool has_events = Kit::SdkBackend::has_ipc_events;

  // True (the check skipped) when there is no device, when the runtime has
  // no inter-process memory members (after checking that the SDK then
  // refuses them with NotSupportedError naming the backend), or when a
  // check that needs a second process cannot start one here.
  static bool no_ipc_memory(Kit& kit, Verdict& v, bool needs_peer = true) {
    if (no_device(kit, v)) return true;
    if constexpr (has_memory) {
      std::string why = needs_peer ? PeerProcess::unavailable() : std::string();
      if (why.empty()) return false;
      v.skip(why);
      return true;
    } else {
      refused(kit, v, "ipc_mem_open", [&] { kit.backend().ipc_mem_open(0, IpcMemHandle{}); });
      v.skip(fmt::format("{} has no inter-process memory members (ipc_mem_export, ipc_mem_open, "
                         "ipc_mem_close); the SDK refuses them, and device tensors cannot be "
                         "shared with other processes",
                         R::name));
      return true;
    }
  }
  // The same for the event members (which need the memory members).
  static bool no_ipc_events(Kit& kit, Verdict& v) {
    if (no_ipc_memory(kit, v)) return true;
    if constexpr (has_events) {
      return false;
    } else {
      refused(kit, v, "ipc_event_open",
              [&] { kit.backend().ipc_event_open(0, IpcEventHandle{}); });
      v.skip(fmt::format("{} has no inter-process event members (ipc_event_export, "
                         "ipc_event_open); the SDK refuses them, and synchronizes the producer's "
                         "stream before it sends a handle",
                         R::name));
      return true;
    }
  }
  template <class F>
  static void refused(Kit&, Verdict& v, const char* call, F&& f) {
    std::string what;
    try {
      f();
      what = fmt::format("{} succeeded", call);
    } catch (const NotSupportedError& e) {
      if (std::string(e.what()).find(std::string(R::name)) == std::string::npos)
        what = fmt::format("the refusal does not name the backend: {}", e.what());
    } catch (const std::exception& e) {
      what = fmt::format("{} threw other than NotSupportedError: {}", call, e.what());
    }
    v.require(what.empty(), fmt::format("without the members the SDK must refuse {} with "
                                        "NotSupportedError naming the backend: {}",
                                        call, what));
  }

  // ------------------------------------------------------------ helpers

  // Device memory of device 0 from raw_malloc, freed at the end of scope.
  struct Allocation {
    Kit& kit;
    std::size_t bytes;
    void* p;
    Allocation(Kit& k, std::size_t n) : kit(k), bytes(n), p(k.backend().raw_malloc(0, n)) {
      if (p == nullptr) throw std::runtime_error(fmt::format("raw_malloc(0, {}) gave nullptr", n));
    }
    ~Allocation() {
      try {
        kit.backend().raw_free(0, p, bytes);
      } catch (...) {
        // The check has failed already, or fails on its next call.
      }
    }
    Allocation(const Allocation&) = delete;
    Allocation& operator=(const Allocation&) = delete;
  };

  // What bytes a range should hold, as the two processes say it in their
  // lines: "pattern <seed> <length>" (pattern(length, seed), indexed by the
  // offset in the allocation) or "fill <byte>".
  static std::string of_pattern(unsigned seed, std::size_t length) {
    return fmt::format("pattern {} {}", seed, length);
  }
  static std::string of_fill(int byte) { return fmt::format("fill {}", byte); }
  static std::vector<unsigned char> expected(std::istringstream& in, std::size_t offset,
                                             std::size_t bytes) {
    std::string kind;
    in >> kind;
    if (kind == "fill") {
      int byte = 0;
      in >> byte;
      return std::vector<unsigned char>(bytes, static_cast<unsigned char>(byte));
    }
    unsigned seed = 0;
    std::size_t length = 0;
    in >> seed >> length;
    if (kind != "pattern" || offset + bytes > length)
      throw std::runtime_error("malformed expectation of bytes");
    std::vector<unsigned char> p = pattern(length, seed);
    return {p.begin() + static_cast<std::ptrdiff_t>(offset),
            p.begin() + static_cast<std::ptrdiff_t>(offset + bytes)};
  }
  // "same", or where `got` first differs from `want` (bytes from `offset`).
  static std::string compare(const std::vector<unsigned char>& got,
                             const std::vector<unsigned char>& want, std::size_t offset) {
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i])
        return fmt::format("byte {} of the allocation is 0x{:02x} where 0x{:02x} was written",
                           offset + i, got[i], want[i]);
    return "same";
  }
  template <std::size_t N>
  static std::string hex(const std::array<std::uint8_t, N>& bytes) {
    return to_hex(bytes.data(), N);
  }

  static std::unique_ptr<PeerProcess> start_peer(const char* check) {
    return std::make_unique<PeerProcess>("interprocess", check, Kit::runtime_type());
  }

  // The first steps of a memory check: `bytes` written into the allocation,
  // its handle exported, and the peer of `check` started with the handle
  // open.
  struct OpenedInPeer {
    IpcMemHandle handle;
    std::unique_ptr<PeerProcess> peer;
  };
  static OpenedInPeer open_in_peer(Kit& kit, const Allocation& a,
                                   const std::vector<unsigned char>& bytes, const char* check) {
    auto& b = kit.backend();
    b.memcpy(0, a.p, bytes.data(), a.bytes, CopyKind::host_to_device);
    OpenedInPeer o{b.ipc_mem_export(0, a.p), start_peer(check)};
    o.peer->channel().ask(fmt::format("open {} {}", hex(o.handle.bytes), a.bytes),
                          "ipc_mem_open");
    return o;
  }

  // The second process's side of every check: the commands of the first,
  // one line each, each answered with one line (Note [The kit's second
  // process]).
  //   open <handle> <bytes>        ipc_mem_open                  -> opened
  //   read <offset> <bytes> <expected bytes>                     -> same | where it differs
  //   write <offset> <bytes> <bytes to write>                    -> written
  //   close                        ipc_mem_close                 -> closed
  //   open_event <handle>          ipc_event_open                -> opened
  //   prepare <bytes>              a stream and memory of its own -> prepared
  //   wait_copy                    event_query of the opened event, stream_wait_event on it,
  //                                a copy of the opened memory behind the wait, then up to
  //                                200 ms for the copy to complete
  //                                -> queued <1 if the query said complete> <1 if the copy did>
  //   check_copy <expected bytes>  the copy's bytes, after stream_synchronize -> same | where
  //   close_event                  event_destroy of the opened event, and what prepare made
  //                                                              -> closed
  //   end                          (the role ends: "done")
  static void serve_peer(Kit& kit, PeerChannel& ch) {
    auto& b = kit.backend();
    void* base = nullptr;
    std::size_t size = 0;
    EventHandle event{};
    StreamHandle stream{};
    void* copy = nullptr;
    std::size_t copy_bytes = 0;
    for (;;) {
      std::istringstream in(ch.receive("its next command"));
      std::string command;
      in >> command;
      if (command == "open") {
        std::string h;
        IpcMemHandle handle;
        in >> h >> size;
        if (!from_hex(h, handle.bytes.data(), handle.bytes.size()))
          throw std::runtime_error("malformed memory handle");
        base = b.ipc_mem_open(0, handle);
        ch.send("opened");
      } else if (command == "read") {
        std::size_t offset = 0, bytes = 0;
        in >> offset >> bytes;
        std::vector<unsigned char> want = expected(in, offset, bytes), got(bytes);
        b.memcpy(0, got.data(), static_cast<char*>(base) + offset, bytes,
                 CopyKind::device_to_host);
        ch.send(compare(got, want, offset));
      } else if (command == "write") {
        std::size_t offset = 0, bytes = 0;
        in >> offset >> bytes;
        std::vector<unsigned char> data = expected(in, offset, bytes);
        b.memcpy(0, static_cast<char*>(base) + offset, data.data(), bytes,
                 CopyKind::host_to_device);
        ch.send("written");
      } else if (command == "close") {
        b.ipc_mem_close(0, base);
        base = nullptr;
        ch.send("closed");
      } else if (command == "open_event") {
        std::string h;
        in >> h;
        if constexpr (has_events) {
          IpcEventHandle handle;
          if (!from_hex(h, handle.bytes.data(), handle.bytes.size()))
            throw std::runtime_error("malformed event handle");
          event = b.ipc_event_open(0, handle);
        }
        ch.send("opened");
      } else if (command == "prepare") {
        in >> copy_bytes;
        stream = b.stream_create(0, 0);
        copy = b.raw_malloc(0, copy_bytes);
        ch.send("prepared");
      } else if (command == "wait_copy") {
        bool complete = b.event_query(0, event);
        b.stream_wait_event(0, stream, event);
        b.memcpy_async(0, copy, base, copy_bytes, CopyKind::device_to_device, stream,
                       no_host_side);
        // The exporter's write waits for this answer: a copy that completes
        // meanwhile did not wait for it.
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
        bool ran = b.stream_query(0, stream);
        while (!ran && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ran = b.stream_query(0, stream);
        }
        ch.send(fmt::format("queued {} {}", complete ? 1 : 0, ran ? 1 : 0));
      } else if (command == "check_copy") {
        b.stream_synchronize(0, stream);
        std::vector<unsigned char> want = expected(in, 0, copy_bytes), got(copy_bytes);
        b.memcpy(0, got.data(), copy, copy_bytes, CopyKind::device_to_host);
        ch.send(compare(got, want, 0));
      } else if (command == "close_event") {
        b.event_destroy(0, event);
        b.raw_free(0, copy, copy_bytes);
        b.stream_destroy(0, stream);
        ch.send("closed");
      } else if (command == "end") {
        return;
      } else {
        throw std::runtime_error(fmt::format("unknown command \"{}\"", command));
      }
    }
  }

  // ------------------------------------------------------------- checks

  // The exporter writes, the opener reads the same bytes; the opener
  // writes, the exporter reads them.
  static void memory_round_trip(Kit& kit, Verdict& v) {
    if (PeerChannel* ch = kit.peer()) return serve_peer(kit, *ch);
    if (no_ipc_memory(kit, v)) return;
    const std::size_t n = (std::size_t{1} << 20) + 4096 + 100;
    Allocation a(kit, n);
    auto [h, peer] = open_in_peer(kit, a, pattern(n, 61), "memory_round_trip");
    PeerChannel& ch = peer->channel();
    std::string got = ch.ask(fmt::format("read 0 {} {}", n, of_pattern(61, n)), "its read");
    v.require(got == "same", fmt::format("the opening process read other bytes than the "
                                         "exporting process wrote ({} bytes): {}",
                                         n, got));
    ch.ask(fmt::format("write 0 {} {}", n, of_pattern(62, n)), "its write");
    v.require(read(kit, a.p, n) == pattern(n, 62),
              fmt::format("the exporting process did not read what the opening process "
                          "wrote into the opened memory: {}",
                          compare(read(kit, a.p, n), pattern(n, 62), 0)));
    ch.ask("close", "ipc_mem_close");
    ch.send("end");
    peer->finish();
  }

  // The handle names the whole allocation: the opener reads each part at
  // its offset from the base ipc_mem_open returned, and sees the exporter's
  // writes made after the open (a mapping, not a copy).
  static void handle_names_whole_allocation(Kit& kit, Verdict& v) {
    if (PeerChannel* ch = kit.peer()) return serve_peer(kit, *ch);
    if (no_ipc_memory(kit, v)) return;
    auto& b = kit.backend();
    const std::size_t n = (std::size_t{3} << 20) + 12345;
    Allocation a(kit, n);
    std::vector<unsigned char> mine = pattern(n, 71);
    auto [h, peer] = open_in_peer(kit, a, mine, "handle_names_whole_allocation");
    PeerChannel& ch = peer->channel();
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, n / 2 - 7,
                               n - 4096 - 3, n - 1}) {
      std::size_t bytes = std::min<std::size_t>(4096, n - offset);
      std::string got =
          ch.ask(fmt::format("read {} {} {}", offset, bytes, of_pattern(71, n)), "its read");
      if (!v.require(got == "same",
                     fmt::format("the opening process read {} bytes at offset {} of the {} "
                                 "byte allocation, from the base ipc_mem_open returned, other "
                                 "than the exporter wrote there (the handle must name the whole "
                                 "allocation): {}",
                                 bytes, offset, n, got)))
        break;
    }
    const std::size_t at = n - 5000, bytes = 3000;
    std::vector<unsigned char> later(bytes, 0xa5);
    b.memcpy(0, static_cast<char*>(a.p) + at, later.data(), bytes, CopyKind::host_to_device);
    std::string got = ch.ask(fmt::format("read {} {} {}", at, bytes, of_fill(0xa5)), "its read");
    v.require(got == "same", fmt::format("the opening process did not see {} bytes the exporter "
                                         "wrote at offset {} after the open (the opened memory "
                                         "must be the exporter's, not a copy): {}",
                                         bytes, at, got));
    ch.ask("close", "ipc_mem_close");
    ch.send("end");
    peer->finish();
  }

  // ipc_mem_close leaves the exporter's memory as it was, usable; the
  // handle opens again after the close.
  static void close_keeps_exporter_memory(Kit& kit, Verdict& v) {
    if (PeerChannel* ch = kit.peer()) return serve_peer(kit, *ch);
    if (no_ipc_memory(kit, v)) return;
    auto& b = kit.backend();
    const std::size_t n = (std::size_t{1} << 20) + 3;
    Allocation a(kit, n);
    std::vector<unsigned char> mine = pattern(n, 81);
    auto [h, peer] = open_in_peer(kit, a, mine, "close_keeps_exporter_memory");
    PeerChannel& ch = peer->channel();
    ch.ask(fmt::format("read 0 {} {}", n, of_pattern(81, n)), "its read");
    ch.ask("close", "ipc_mem_close");
    std::vector<unsigned char> after = read(kit, a.p, n);
    v.require(after == mine, fmt::format("after the opening process closed the memory "
                                         "(ipc_mem_close), the exporter's bytes changed: {}",
                                         compare(after, mine, 0)));
    std::vector<unsigned char> again = pattern(n, 82);
    b.memcpy(0, a.p, again.data(), n, CopyKind::host_to_device);
    v.require(read(kit, a.p, n) == again,
              "after the opening process closed the memory, the exporter's writes to it did not "
              "read back");
    ch.ask(fmt::format("open {} {}", hex(h.bytes), n), "ipc_mem_open after the close");
    std::string got = ch.ask(fmt::format("read 0 {} {}", n, of_pattern(82, n)), "its read");
    v.require(got == "same", fmt::format("the handle opened again after ipc_mem_close read "
                                         "other bytes than the exporter wrote: {}",
                                         got));
    ch.ask("close", "ipc_mem_close");
    ch.send("end");
    peer->finish();
  }

  // Opening a handle in the process that exported it is refused with a
  // DriverError (CUDA refuses it: "invalid device context"), changing
  // nothing.
  static void open_in_exporting_process_refused(Kit& kit, Verdict& v) {
    if (no_ipc_memory(kit, v, false)) return;
    auto& b = kit.backend();
    const std::size_t n = 65536;
    Allocation a(kit, n);
    std::vector<unsigned char> mine = pattern(n, 91);
    b.memcpy(0, a.p, mine.data(), n, CopyKind::host_to_device);
    IpcMemHandle h = b.ipc_mem_export(0, a.p);
    std::string outcome;
    try {
      void* p = b.ipc_mem_open(0, h);
      outcome = fmt::format("returned {}", p);
      try {
        b.ipc_mem_close(0, p);
      } catch (const std::exception& e) {
        outcome += fmt::format(" (and closing it threw: {})", e.what());
      }
    } catch (const DriverError&) {
    } catch (const std::exception& e) {
      outcome = fmt::format("threw other than a DriverError: {}", e.what());
    }
    v.require(outcome.empty(), fmt::format("ipc_mem_open of a handle this process exported "
                                           "must be refused with a DriverError, as CUDA's is; "
                                           "it {}",
                                           outcome));
    v.require(read(kit, a.p, n) == mine,
              "opening a handle in the process that exported it changed the exporter's bytes");
  }

  // An interprocess event orders the exporter's work before the opener's:
  // a stream of the opening process that waits on the opened event copies
  // the shared memory only after the write the exporter recorded the event
  // behind, and event_query of the opened event is false while that write
  // waits. The exporter's stream is held until the opener has queued its
  // wait by a host signal (Note [Host signals]) where the runtime has the
  // members, else by 1 GiB of copies queued before the write.
  static void event_orders_write_before_read(Kit& kit, Verdict& v) {
    if (PeerChannel* ch = kit.peer()) return serve_peer(kit, *ch);
    if (no_ipc_events(kit, v)) return;
    auto& b = kit.backend();
    const std::size_t n = std::size_t{4} << 20;
    Allocation a(kit, n);
    std::vector<unsigned char> zeros(n, 0);
    b.memcpy(0, a.p, zeros.data(), n, CopyKind::host_to_device);
    IpcMemHandle h = b.ipc_mem_export(0, a.p);
    EventHandle e = b.event_create(0, EventFlags::interprocess);
    StreamHandle s = b.stream_create(0, 0);
    constexpr bool gated = Kit::SdkBackend::has_stream_signals;
    SignalHandle gate{};
    bool open_gate = false;
    Busy w{};
    auto release = [&] {
      if constexpr (gated) {
        if (open_gate) b.signal_complete(0, gate, 0);
        open_gate = false;
      }
    };
    auto cleanup = [&] {
      release();
      b.stream_synchronize(0, s);
      if constexpr (gated) {
        if (gate) b.signal_destroy(0, gate);
      } else {
        if (w.a) free_busy(kit, 0, w);
      }
      b.stream_destroy(0, s);
      b.event_destroy(0, e);
    };
    try {
      IpcEventHandle eh{};
      if constexpr (has_events) eh = b.ipc_event_export(0, e);
      if constexpr (!gated) w = make_busy(kit, 0);
      auto peer = start_peer("event_orders_write_before_read");
      PeerChannel& ch = peer->channel();
      ch.ask(fmt::format("open {} {}", hex(h.bytes), n), "ipc_mem_open");
      ch.ask(fmt::format("open_event {}", hex(eh.bytes)), "ipc_event_open");
      ch.ask(fmt::format("prepare {}", n), "a stream and memory of its own");
      auto t0 = std::chrono::steady_clock::now();
      if constexpr (gated) {
        gate = b.signal_create(0);
        b.stream_wait_signal(0, s, gate);
        open_gate = true;
      } else {
        queue_busy(kit, 0, w, s, 16);
      }
      b.memset_async(0, a.p, 0x6d, n, s);  // the write the record follows
      b.event_record(0, e, s);
      std::string queued = ch.ask("wait_copy", "its wait and copy");
      bool waiting = !b.event_query(0, e);  // still, after the opener queued its wait
      release();
      std::string got = ch.ask(fmt::format("check_copy {}", of_fill(0x6d)), "its copy");
      b.stream_synchronize(0, s);
      double work = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::istringstream answer(queued);
      std::string word;
      int query_complete = 1, ran = 1;
      answer >> word >> query_complete >> ran;
      if (waiting) {
        v.require(query_complete == 0,
                  "event_query of the opened event answered complete while the exporter's "
                  "write recorded before the event had not run");
        v.require(ran == 0,
                  "a stream of the opening process waiting on the opened event ran past the "
                  "wait (the copy behind it completed) while the exporter's write recorded "
                  "before the event had not run");
      }
      v.require(got == "same",
                fmt::format("a stream of the opening process waiting on the opened event "
                            "copied the shared memory before the exporter's write, recorded "
                            "before the event, had run: {}",
                            got));
      if (!waiting)
        v.skip(fmt::format("the exporter's work ({:.1f} ms) completed before the opening "
                           "process queued its wait: too fast to tell",
                           work * 1e3));
      ch.ask("close_event", "event_destroy");
      ch.ask("close", "ipc_mem_close");
      ch.send("end");
      peer->finish();
    } catch (...) {
      cleanup();
      throw;
    }
    cleanup();
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

#define ACCELKIT_CONFORMANCE_INTERPROCESS_CHECKS(X)                                            \
  X(interprocess, memory_round_trip,                                                           \
    "a process that opens exported memory reads the exporter's bytes, and the exporter reads " \
    "its writes")                                                                              \
  X(interprocess, handle_names_whole_allocation,                                               \
    "a handle names the whole allocation: every offset from the opened base, and writes made " \
    "after the open")                                                                          \
  X(interprocess, close_keeps_exporter_memory,                                                 \
    "ipc_mem_close leaves the exporter's memory intact and usable; the handle opens again")    \
  X(interprocess, open_in_exporting_process_refused,                                           \
    "opening a handle in the process that exported it is refused with a DriverError")         \
  X(interprocess, event_orders_write_before_read,                                              \
    "a wait on an opened interprocess event orders the exporter's recorded work before the "   \
    "opener's")
