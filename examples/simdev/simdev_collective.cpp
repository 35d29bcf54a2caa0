// simdev's own collective library: all_reduce between the processes of one
// host through POSIX shared memory, offered to accelkit's process group
// through its vendor collective slot as torch.ops.simdev_collectives
// (Note [The vendor collective slot] in python/accelkit/distributed.py).
//
// Note [simdev's shared-memory all_reduce]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A communicator is one shared segment (shm_open): a header of per-rank
// sequence counters and process ids, then one slot of `kSlotBytes` per
// rank. Rank 0 creates it under a name the ranks agree on through the c10d
// store, the others open it, and rank 0 unlinks the name once all have it
// mapped (the segment lives while mapped). A failed open unlinks the name
// it created; a rank-0 process that dies between creating the segment and
// unlinking it (killed while the others open it) leaves the name behind in
// /dev/shm until reboot or a manual unlink, as any shm_open user does.
// A tensor goes in chunks of at most a slot; for chunk number s each rank
//   1. waits until every rank has finished reading chunk s-1 (done >= s-1),
//      so its slot may be overwritten;
//   2. copies its chunk into its slot and publishes arrived = s (release);
//   3. waits until every rank has arrived at s (acquire), then reduces the
//      slots in rank order into its own tensor, so every rank computes the
//      same bits (with two ranks, gloo's bits too: a + b == b + a);
//   4. publishes done = s.
// A wait that lasts longer than the group's timeout, or whose peer process
// is gone (kill(pid, 0) fails with ESRCH: the ranks share a host, and a
// pid namespace), raises a RuntimeError naming the rank, never hangs. The
// data are the CPU tensors the process group hands this library (views of
// host-visible device memory, or staged copies), contiguous; this library
// takes float32 and float64 with SUM, AVG, MIN, MAX, and refuses the rest
// through supports(), whose answer depends only on what the ranks agreed
// on, so every rank takes the same path.
#include <torch/library.h>

#include <ATen/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

constexpr int kMaxRanks = 64;
constexpr std::size_t kSlotBytes = std::size_t{4} << 20;
constexpr std::uint64_t kMagic = 0x61636b6c73686d31;  // "acklshm1"

struct alignas(64) Counter {
  std::atomic<std::uint64_t> value{0};
};

struct Header {
  std::uint64_t magic;
  std::int64_t size;
  Counter arrived[kMaxRanks];
  Counter done[kMaxRanks];
  std::atomic<std::int64_t> pid[kMaxRanks];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "lock-free 64-bit atomics");
constexpr std::size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;

enum class Op { sum, avg, min, max };

struct Comm {
  std::string name;
  int rank = 0;
  int size = 0;
  void* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t seq = 0;       // chunks done by this rank
  std::uint64_t reduces = 0;   // all_reduce calls done here (the test's counter)
  bool broken = false;         // a wait failed: the ranks' counters disagree
  std::mutex busy;             // one collective at a time on a communicator

  Header* header() const { return static_cast<Header*>(base); }
  char* slot(int r) const { return static_cast<char*>(base) + kHeaderBytes + r * kSlotBytes; }
  ~Comm() {
    if (base != nullptr) munmap(base, bytes);
  }
};

std::mutex comms_mutex;
std::map<int64_t, std::shared_ptr<Comm>> comms;
int64_t next_comm = 1;

std::shared_ptr<Comm> find(int64_t id, const char* what) {
  std::lock_guard<std::mutex> lock(comms_mutex);
  auto it = comms.find(id);
  TORCH_CHECK_VALUE(it != comms.end(), "simdev_collectives: ", what, ": no communicator ", id);
  return it->second;
}

Op parse_op(const std::string& op) {
  if (op == "SUM") return Op::sum;
  if (op == "AVG") return Op::avg;
  if (op == "MIN") return Op::min;
  if (op == "MAX") return Op::max;
  TORCH_CHECK_VALUE(false, "simdev_collectives: all_reduce: unsupported reduce op ", op);
}

bool supported_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::Double;
}

// Whether process `pid` has exited: no such process, or a zombie not yet
// reaped by its parent (which a launcher may do only later).
bool gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // "pid (comm) state ..."
  return n > 0 && paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// Waits until every rank's `counters` reach `target`; raises naming the
// first rank that is late past the deadline or whose process is gone.
void wait_all(const Comm& c, Counter* counters, std::uint64_t target, double timeout_s,
              const char* step) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  int spins = 0;
  for (int r = 0; r < c.size; ++r) {
    while (counters[r].value.load(std::memory_order_acquire) < target) {
      if (++spins < 200) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 500));
      if (spins % 64 != 0) continue;
      const std::int64_t pid = c.header()->pid[r].load(std::memory_order_acquire);
      if (pid > 0 && gone(static_cast<pid_t>(pid))) {
        TORCH_CHECK(false, "simdev_collectives: all_reduce: rank ", r, " (pid ", pid,
                    ") exited in the middle of the collective (", step, ")");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        TORCH_CHECK(false, "simdev_collectives: all_reduce: rank ", r,
                    " did not take part within the group's timeout of ", timeout_s, " s (",
                    step, ")");
      }
    }
  }
}

template <typename T>
void reduce_into(const Comm& c, T* out, std::size_t offset, std::size_t n, Op op) {
  const T* first = reinterpret_cast<const T*>(c.slot(0));
  std::copy(first, first + n, out + offset);
  for (int r = 1; r < c.size; ++r) {
    const T* in = reinterpret_cast<const T*>(c.slot(r));
    T* o = out + offset;
    switch (op) {
      case Op::sum:
      case Op::avg:
        for (std::size_t i = 0; i < n; ++i) o[i] = o[i] + in[i];
        break;
      case Op::min:
        for (std::size_t i = 0; i < n; ++i) o[i] = in[i] < o[i] ? in[i] : o[i];
        break;
      case Op::max:
        for (std::size_t i = 0; i < n; ++i) o[i] = in[i] > o[i] ? in[i] : o[i];
        break;
    }
  }
  if (op == Op::avg) {
    const T size = static_cast<T>(c.size);
    T* o = out + offset;
    for (std::size_t i = 0; i < n; ++i) o[i] = o[i] / size;
  }
}

template <typename T>
void all_reduce(Comm& c, T* data, std::size_t count, Op op, double timeout_s) {
  const std::size_t per_chunk = kSlotBytes / sizeof(T);
  Header* h = c.header();
  for (std::size_t offset = 0; offset < count; offset += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - offset);
    const std::uint64_t s = ++c.seq;
    wait_all(c, h->done, s - 1, timeout_s, "waiting for the ranks to read the last chunk");
    std::memcpy(c.slot(c.rank), data + offset, n * sizeof(T));
    h->arrived[c.rank].value.store(s, std::memory_order_release);
    wait_all(c, h->arrived, s, timeout_s, "waiting for the ranks' data");
    reduce_into(c, data, offset, n, op);
    h->done[c.rank].value.store(s, std::memory_order_release);
  }
}

}  // namespace

// The library, from Python (accelkit's slot adapter calls these):
// - open(name, rank, size, create) -> communicator: rank 0 with create=True
//   makes the segment, the others open it after (the store says when);
// - unlink(name): rank 0, once every rank has opened it;
// - supports(collective, op, dtype): what this library implements;
// - all_reduce(comm, tensor, op, timeout_s): in place, on a contiguous CPU
//   tensor, blocking until every rank's share is reduced;
// - reduces(comm): how many all_reduce calls this communicator ran;
// - close(comm).
TORCH_LIBRARY(simdev_collectives, m) {
  m.def("open(str name, int rank, int size, bool create) -> int",
        [](std::string name, int64_t rank, int64_t size, bool create) {
          TORCH_CHECK_VALUE(size >= 1 && size <= kMaxRanks, "simdev_collectives: open: ",
                            size, " ranks, at most ", kMaxRanks);
          TORCH_CHECK_VALUE(rank >= 0 && rank < size, "simdev_collectives: open: rank ", rank,
                            " of ", size);
          auto c = std::make_shared<Comm>();
          c->name = name;
          c->rank = static_cast<int>(rank);
          c->size = static_cast<int>(size);
          c->bytes = kHeaderBytes + static_cast<std::size_t>(size) * kSlotBytes;
          int fd = shm_open(name.c_str(), create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
          TORCH_CHECK(fd >= 0, "simdev_collectives: open: shm_open(", name, "): ",
                      std::strerror(errno));
          // Until the communicator is registered, every error path unmaps what
          // it mapped and, on the rank that created the name, unlinks it: no
          // failed open leaves a segment behind.
          struct Undo {
            const std::string& name;
            bool create;
            void* base = nullptr;
            std::size_t bytes = 0;
            bool armed = true;
            ~Undo() {
              if (!armed) return;
              if (base != nullptr) munmap(base, bytes);
              if (create) shm_unlink(name.c_str());
            }
          } undo{name, create};
          if (create && ftruncate(fd, static_cast<off_t>(c->bytes)) != 0) {
            const int err = errno;
            close(fd);
            TORCH_CHECK(false, "simdev_collectives: open: ftruncate(", name, ", ", c->bytes,
                        "): ", std::strerror(err));
          }
          void* p = mmap(nullptr, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          const int err = errno;
          close(fd);
          TORCH_CHECK(p != MAP_FAILED, "simdev_collectives: open: mmap(", name, "): ",
                      std::strerror(err));
          undo.base = p;
          undo.bytes = c->bytes;
          c->base = p;
          Header* h = c->header();
          if (create) {
            new (h) Header();  // zeroed counters (ftruncate zero-fills too)
            h->size = size;
            std::atomic_thread_fence(std::memory_order_release);
            h->magic = kMagic;
          }
          TORCH_CHECK(h->magic == kMagic && h->size == size, "simdev_collectives: open: ",
                      name, " is not a communicator of ", size, " ranks");
          h->pid[rank].store(static_cast<std::int64_t>(getpid()), std::memory_order_release);
          std::lock_guard<std::mutex> lock(comms_mutex);
          comms.emplace(next_comm, std::move(c));
          undo.armed = false;  // the communicator owns the mapping; rank 0 unlinks the name
          return next_comm++;
        });
  m.def("unlink(str name) -> ()", [](std::string name) { shm_unlink(name.c_str()); });
  m.def("supports(str collective, str op, ScalarType dtype) -> bool",
        [](std::string collective, std::string op, c10::ScalarType dtype) {
          return collective == "all_reduce" &&
                 (op == "SUM" || op == "AVG" || op == "MIN" || op == "MAX") &&
                 supported_dtype(dtype);
        });
  m.def("all_reduce(int comm, Tensor(a!) tensor, str op, float timeout_s) -> ()",
        [](int64_t id, at::Tensor t, std::string op_name, double timeout_s) {
          std::shared_ptr<Comm> c = find(id, "all_reduce");
          const Op op = parse_op(op_name);
          TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_contiguous(),
                            "simdev_collectives: all_reduce takes a contiguous CPU tensor, got ",
                            t.device(), t.is_contiguous() ? "" : " (not contiguous)");
          TORCH_CHECK_VALUE(supported_dtype(t.scalar_type()),
                            "simdev_collectives: all_reduce: unsupported dtype ", t.scalar_type());
          std::lock_guard<std::mutex> lock(c->busy);
          TORCH_CHECK(!c->broken, "simdev_collectives: all_reduce: the communicator failed "
                      "in an earlier collective (a rank died or timed out); make a new group");
          const auto count = static_cast<std::size_t>(t.numel());
          c->broken = true;  // until this collective completes
          if (t.scalar_type() == c10::ScalarType::Float) {
            all_reduce(*c, t.data_ptr<float>(), count, op, timeout_s);
          } else {
            all_reduce(*c, t.data_ptr<double>(), count, op, timeout_s);
          }
          c->broken = false;
          ++c->reduces;
        });
  m.def("reduces(int comm) -> int", [](int64_t id) {
    std::shared_ptr<Comm> c = find(id, "reduces");
    std::lock_guard<std::mutex> lock(c->busy);
    return static_cast<int64_t>(c->reduces);
  });
  m.def("close(int comm) -> ()", [](int64_t id) {
    std::lock_guard<std::mutex> lock(comms_mutex);
    comms.erase(id);
  });
}
