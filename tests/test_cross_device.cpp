// Waits across devices (Note [Cross-device waits]): a stream of device 1
// waits for an event recorded on device 0, on the device when the runtime
// has stream_wait_peer_event (simdev), on the host when it has not. Device
// 0's work is held back by simdev's gate, so work of device 1 that ran too
// early would see the old bytes.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace accelkit;

using namespace accelkit_tests;
namespace {
// simdev without stream_wait_peer_event: everything else forwarded.
struct NoPeerWait : Runtime<NoPeerWait> {
  static constexpr std::string_view name = "nopeerwait";
  explicit NoPeerWait(simdev::Config c) : sim(std::move(c)) {}
  simdev::SimRuntime sim;
  int device_count() { return sim.device_count(); }
  DeviceProperties properties(device_index d) {
    DeviceProperties p = sim.properties(d);
    p.extras.clear();  // simdev's extras are namespaced "simdev."
    return p;
  }
  device_index get_device() { return sim.get_device(); }
  void set_device(device_index d) { sim.set_device(d); }
  void* malloc(device_index d, std::size_t n) { return sim.malloc(d, n); }
  void free(device_index d, void* p) { sim.free(d, p); }
  void* host_malloc(device_index d, std::size_t n) { return sim.host_malloc(d, n); }
  void host_free(device_index d, void* p) { sim.host_free(d, p); }
  void memcpy(device_index d, void* dst, const void* src, std::size_t n, CopyKind k) {
    sim.memcpy(d, dst, src, n, k);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    sim.memcpy_async(d, dst, src, n, k, s, pinned);
  }
  void memset_async(device_index d, void* p, int v, std::size_t n, StreamHandle s) {
    sim.memset_async(d, p, v, n, s);
  }
  void memcpy_peer_async(void* dst, device_index dd, const void* src, device_index sd,
                         std::size_t n, StreamHandle s) {
    sim.memcpy_peer_async(dst, dd, src, sd, n, s);
  }
  StreamHandle stream_create(device_index d, int p) { return sim.stream_create(d, p); }
  void stream_destroy(device_index d, StreamHandle s) { sim.stream_destroy(d, s); }
  bool stream_query(device_index d, StreamHandle s) { return sim.stream_query(d, s); }
  void stream_synchronize(device_index d, StreamHandle s) { sim.stream_synchronize(d, s); }
  void stream_wait_event(device_index d, StreamHandle s, EventHandle e) {
    sim.stream_wait_event(d, s, e);
  }
  EventHandle event_create(device_index d, EventFlags f) { return sim.event_create(d, f); }
  void event_destroy(device_index d, EventHandle e) { sim.event_destroy(d, e); }
  void event_record(device_index d, EventHandle e, StreamHandle s) { sim.event_record(d, e, s); }
  bool event_query(device_index d, EventHandle e) { return sim.event_query(d, e); }
  void event_synchronize(device_index d, EventHandle e) { sim.event_synchronize(d, e); }
  void device_synchronize(device_index d) { sim.device_synchronize(d); }
};
static_assert(detail::has_stream_wait_peer_event<simdev::SimRuntime>);
static_assert(!detail::has_stream_wait_peer_event<NoPeerWait>);

simdev::SimRuntime& sim_of(Backend<simdev::SimRuntime>& b) { return b.runtime(); }
simdev::SimRuntime& sim_of(Backend<NoPeerWait>& b) { return b.runtime().sim; }

// One byte pattern per buffer, on two devices: src on device 0 ('a'), mid
// and out on device 1 ('x', 'y'). Device 0's queued work copies src into
// mid; device 1's work after the wait copies mid into out, so out reads 'a'
// only if device 1 waited for device 0.
template <class R>
struct Pipeline {
  static constexpr std::size_t n = 1 << 16;
  Backend<R> b{Environment::fixed({}), sim()};
  Streams<R> st{b};
  Stream s0 = st.create_stream(0);
  Stream s1 = st.create_stream(1);
  void* src = b.raw_malloc(0, n);
  void* mid = b.raw_malloc(1, n);
  void* out = b.raw_malloc(1, n);
  std::shared_ptr<simdev::SimRuntime::Gate> gate;

  Pipeline() {
    fill(0, src, 'a');
    fill(1, mid, 'x');
    fill(1, out, 'y');
    // Device 0: held, then the copy into device 1's memory.
    gate = sim_of(b).hold(0, st.handle(s0));
    b.memcpy_peer_async(mid, 1, src, 0, n, st.handle(s0));
  }
  ~Pipeline() {
    if (gate) gate->open();
    st.device_synchronize(0);
    st.device_synchronize(1);
    st.destroy_stream(s0);
    st.destroy_stream(s1);
    b.raw_free(0, src, n);
    b.raw_free(1, mid, n);
    b.raw_free(1, out, n);
  }
  void fill(device_index d, void* p, char value) {
    std::vector<char> host(n, value);
    b.memcpy(d, p, host.data(), n, CopyKind::host_to_device);
  }
  char first(device_index d, void* p) {
    char c = 0;
    b.memcpy(d, &c, p, 1, CopyKind::device_to_host);
    return c;
  }
  // Device 1's work: queued on s1 after the wait.
  void consume() {
    b.memcpy_async(1, out, mid, n, CopyKind::device_to_device, st.handle(s1), false);
  }
  // Opens the gate from another thread after `ms`, setting `opened` first.
  std::thread open_later(std::atomic<bool>& opened, int ms) {
    auto g = std::move(gate);
    return std::thread([g, &opened, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      opened = true;
      g->open();
    });
  }
};
}  // namespace

TEST_CASE("cross-device waits: simdev's stream waits on the device for an event of device 0") {
  Pipeline<simdev::SimRuntime> p;
  Event<simdev::SimRuntime> e(p.st);
  e.record(p.s0);
  e.block(p.s1);  // returns at once: the wait is queued on s1
  CHECK_FALSE(e.query());
  p.consume();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(p.st.query(p.s1));  // held behind device 0's gate
  CHECK(p.first(1, p.out) == 'y');
  // A later record of the event, completing at once on an idle stream of
  // device 0, does not release the wait (it is tied to the record it saw).
  Stream idle = p.st.create_stream(0);
  e.record(idle);
  CHECK(e.query());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(p.st.query(p.s1));
  CHECK(p.first(1, p.out) == 'y');
  p.gate->open();
  p.st.synchronize(p.s1);
  CHECK(p.first(1, p.out) == 'a');  // device 1's copy saw device 0's result
  p.st.destroy_stream(idle);
}

TEST_CASE("cross-device waits: wait_stream orders a stream after another device's stream") {
  Pipeline<simdev::SimRuntime> p;
  p.st.wait_stream(p.s1, p.s0);
  p.consume();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(p.st.query(p.s1));
  CHECK(p.first(1, p.out) == 'y');
  p.gate->open();
  p.st.synchronize(p.s1);
  CHECK(p.first(1, p.out) == 'a');
}

TEST_CASE("cross-device waits: without stream_wait_peer_event the SDK waits on the host") {
  Pipeline<NoPeerWait> p;
  SECTION("Event::block") {
    Event<NoPeerWait> e(p.st);
    e.record(p.s0);
    std::atomic<bool> opened{false};
    std::thread opener = p.open_later(opened, 30);
    e.block(p.s1);  // returns once device 0's record has completed
    CHECK(opened);
    CHECK(e.query());
    opener.join();
  }
  SECTION("Streams::wait_stream") {
    std::atomic<bool> opened{false};
    std::thread opener = p.open_later(opened, 30);
    p.st.wait_stream(p.s1, p.s0);
    CHECK(opened);
    opener.join();
  }
  CHECK(p.first(1, p.mid) == 'a');  // device 0's work is done
  p.consume();
  p.st.synchronize(p.s1);
  CHECK(p.first(1, p.out) == 'a');
}

TEST_CASE("cross-device waits: simdev refuses a wait that names the wrong device") {
  Backend<simdev::SimRuntime> b(Environment::fixed({}), sim());
  Streams<simdev::SimRuntime> st(b);
  StreamHandle s1 = st.handle(st.default_stream(1));
  EventHandle on0 = b.event_create(0, EventFlags::none);
  EventHandle on1 = b.event_create(1, EventFlags::none);
  // The same-device member with an event of another device: the driver's
  // error, so an SDK that routes a cross-device wait there is caught.
  CHECK_THROWS_AS(b.stream_wait_event(1, s1, on0), DriverError);
  // An event of device 1 passed as device 0's.
  CHECK_THROWS_AS(b.runtime().stream_wait_peer_event(1, s1, 0, on1), DriverError);
  // The SDK's entry names a same-device wait as the caller's mistake.
  try {
    b.stream_wait_peer_event(1, s1, 1, on1);
    FAIL("a peer wait on the event's own device");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("simdev:1, the waiting stream's own device") !=
          std::string::npos);
  }
  b.stream_wait_peer_event(1, s1, 0, on0);  // never recorded: nothing to wait for
  CHECK(st.query(st.default_stream(1)));
  b.event_destroy(0, on0);
  b.event_destroy(1, on1);
}

TEST_CASE("cross-device waits: a peer wait whose queued work fails still orders, then reports") {
  Pipeline<simdev::SimRuntime> p;
  p.b.runtime().inject_fault("stream_wait_peer_event", 1, /*async=*/true);
  // s1 held too, so that the failing wait runs (and its error is set) only
  // after device 1's copy is queued behind it.
  auto gate1 = p.b.runtime().hold(1, p.st.handle(p.s1));
  Event<simdev::SimRuntime> e(p.st);
  e.record(p.s0);
  e.block(p.s1);
  p.consume();
  gate1->open();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(p.first(1, p.out) == 'y');  // still waits: a failing wait is not released early
  p.gate->open();
  CHECK_THROWS_AS(p.st.synchronize(p.s1), DriverError);  // the failure, once
  p.st.synchronize(p.s1);
  CHECK(p.first(1, p.out) == 'a');
}

TEST_CASE("cross-device waits: the runtime is called with physical devices") {
  // Logical 0 is physical 1 and logical 1 physical 0: simdev refuses an
  // event whose device is not the one named, so a wrong mapping fails.
  Backend<simdev::SimRuntime> b(Environment::fixed({{"SIMDEV_VISIBLE_DEVICES", "1,0"}}), sim());
  Streams<simdev::SimRuntime> st(b);
  Stream s0 = st.create_stream(0), s1 = st.create_stream(1);
  auto gate = b.runtime().hold(1, st.handle(s0));  // physical 1 = logical 0
  Event<simdev::SimRuntime> e(st);
  e.record(s0);
  e.block(s1);
  CHECK_FALSE(e.query());
  gate->open();
  st.synchronize(s1);
  CHECK(e.query());
  st.destroy_stream(s0);
  st.destroy_stream(s1);
}
