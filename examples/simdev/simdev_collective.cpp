// simdev's own collective library: collectives between the processes of one
// host through POSIX shared memory, offered to accelkit's process group
// through its vendor collective slot as torch.ops.simdev_collectives
// (Note [The vendor collective slot] in python/accelkit/distributed/native.py).
//
// Note [simdev's shared-memory collectives]
// Problem: accelkit's process group needs a vendor library behind its vendor
// collective slot to be exercised, and simdev's ranks are processes of one
// host. Every rank must compute the same bits, a dead peer must not hang the
// others, and no rank may take one collective's step for another's.
// Decision: a communicator is one shared segment (shm_open): a header of per-rank
// sequence counters and process ids, then one slot of `kSlotBytes` per
// rank. Rank 0 creates it under a name the ranks agree on through the c10d
// store, the others open it, and rank 0 unlinks the name once all have it
// mapped (the segment lives while mapped). A failed open unlinks the name
// it created.
// Every collective is a sequence of steps (`step`), each named by a token:
// the collective's number in the process group (`seq`, which the group gives
// every call, the same on every rank), its kind, and the step's number in
// it. In step s each rank
//   1. waits until every rank has finished reading its previous step
//      (done >= that step's token), so its slot may be overwritten;
//   2. writes its part into its slot and publishes arrived = s's token
//      (release);
//   3. waits until every rank has arrived at s's token (acquire), then reads
//      the slots it needs;
//   4. publishes done = s's token.
// Tokens grow with the group's numbering, so an arrival left behind by a
// collective that failed on another rank (a rank that never entered it)
// is older than the token waited for and is never read as this step's: the
// wait goes on past it. An arrival newer than the step, or of another kind,
// means the ranks run different collectives: an error.
// The ranks take the same number of steps: it depends only on what they
// agreed on (the dtype and the element count, checked by the process group
// before each collective). all_reduce and reduce move a tensor in chunks of
// a slot and reduce the slots in rank order (so every rank computes the
// same bits; with two ranks, gloo's bits too: a + b == b + a); reduce writes
// the result on the root only. broadcast copies the root's slot; all_gather
// copies every rank's slot into its place in the output; reduce_scatter
// writes, for each rank, its share of the chunk at that rank's offset in the
// slot and reduces the shares meant for it; all_to_all first exchanges the
// ranks' splits (every rank checks the whole matrix alike), then moves each
// pair's segment in pieces of a slot's share; barrier is one step without
// data. A wait that lasts longer than the group's timeout, or whose peer
// process is gone (kill(pid, 0) fails with ESRCH, or it is a zombie: the
// ranks share a host, and a pid namespace), raises a RuntimeError naming
// the collective and the rank, never hangs.
// A failure aborts the communicator for every rank: the first rank to fail
// (or the process group, through abort(), when the collective failed before
// reaching the library) writes its reason into the header, every wait of
// every rank sees it at its next poll and raises it, and every later
// collective on the communicator is refused with it, on every rank, until
// the group is made again. The data are the CPU tensors the process group
// hands this library (views of host-visible device memory, or staged
// copies), contiguous. supports(): the reductions (all_reduce, reduce,
// reduce_scatter) take float32 and float64 with SUM, AVG, MIN, MAX;
// broadcast, all_gather and all_to_all copy bytes, any dtype; barrier; the
// rest (integer or bfloat16 reductions, PRODUCT, the bitwise ops) go to
// gloo. The answer depends only on what the ranks agreed on, so every rank
// takes the same path.
// Limits: one host only; a rank-0 process that dies between creating the
// segment and unlinking it (killed while the others open it) leaves the name
// behind in /dev/shm until reboot or a manual unlink, as any shm_open user
// does; data move through a slot at a time, so a collective's time grows
// with its size over kSlotBytes.
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
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

constexpr int kMaxRanks = 64;
constexpr std::size_t kSlotBytes = std::size_t{4} << 20;
constexpr std::uint64_t kMagic = 0x61636b6c73686d32;  // "acklshm2"
constexpr std::size_t kReasonBytes = 1024;

struct alignas(64) Counter {
  std::atomic<std::uint64_t> value{0};
};

struct Header {
  std::uint64_t magic;
  std::int64_t size;
  Counter arrived[kMaxRanks];
  Counter done[kMaxRanks];
  std::atomic<std::int64_t> pid[kMaxRanks];
  // The abort (Note [simdev's shared-memory collectives]): 0, or 1 + the
  // rank that aborted first; `reason` is complete once reason_ready is 1.
  std::atomic<std::int64_t> aborted;
  std::atomic<std::int32_t> reason_ready;
  char reason[kReasonBytes];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "lock-free 64-bit atomics");
constexpr std::size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;

enum class Op { sum, avg, min, max };

// What each communicator ran (the tests' counters): one per collective.
constexpr const char* kCollectives[] = {"all_reduce", "reduce", "broadcast", "all_gather",
                                        "reduce_scatter", "barrier", "all_to_all"};
constexpr int kKinds = sizeof kCollectives / sizeof kCollectives[0];

int kind_of(const std::string& collective) {
  for (int k = 0; k < kKinds; ++k)
    if (collective == kCollectives[k]) return k;
  return -1;
}

// A step's token: the collective's number in the group, its kind and the
// step's number in it, ordered as the group issues them.
constexpr int kStepBits = 28;
constexpr std::uint64_t kMaxSeq = (std::uint64_t{1} << 32) - 1;
constexpr std::uint64_t kMaxStep = (std::uint64_t{1} << kStepBits) - 1;

std::uint64_t token(std::uint64_t seq, int kind, std::uint64_t step) {
  return seq << 32 | static_cast<std::uint64_t>(kind) << kStepBits | step;
}
std::string describe(std::uint64_t t) {
  if (t == 0) return "no collective yet";
  const auto kind = static_cast<int>(t >> kStepBits & 0xf);
  return std::string("collective #") + std::to_string(t >> 32) + " (" +
         (kind < kKinds ? kCollectives[kind] : "?") + "), step " +
         std::to_string(t & kMaxStep);
}

struct Comm {
  std::string name;
  int rank = 0;
  int size = 0;
  void* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t last = 0;             // the token of this rank's last step
  std::uint64_t seq = 0;              // the collective running (its number in the group)
  int kind = 0;                       // and its kind
  std::uint64_t steps = 0;            // its steps so far
  std::uint64_t calls[kKinds] = {};   // collectives done here, per kind
  std::mutex busy;                    // one collective at a time on a communicator

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

bool reduce_op(const std::string& op) {
  return op == "SUM" || op == "AVG" || op == "MIN" || op == "MAX";
}

Op parse_op(const std::string& op, const char* what) {
  if (op == "SUM") return Op::sum;
  if (op == "AVG") return Op::avg;
  if (op == "MIN") return Op::min;
  if (op == "MAX") return Op::max;
  TORCH_CHECK_VALUE(false, "simdev_collectives: ", what, ": unsupported reduce op ", op);
}

bool float_dtype(c10::ScalarType t) {
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

// The reason the communicator was aborted ("" while it is not).
std::string abort_reason(const Comm& c) {
  const Header* h = c.header();
  const std::int64_t by = h->aborted.load(std::memory_order_acquire);
  if (by == 0) return {};
  // The aborting rank writes the reason right after claiming the abort.
  for (int i = 0; i < 10000 && h->reason_ready.load(std::memory_order_acquire) == 0; ++i)
    std::this_thread::yield();
  std::string reason = h->reason_ready.load(std::memory_order_acquire) != 0
                           ? std::string(h->reason, strnlen(h->reason, kReasonBytes))
                           : std::string("(its reason was not written)");
  return "the communicator was aborted by rank " + std::to_string(by - 1) + ": " + reason;
}

// Aborts the communicator for every rank with `reason`, unless it was
// aborted already (the first reason stays).
void abort_comm(const Comm& c, const std::string& reason) {
  Header* h = c.header();
  std::int64_t expected = 0;
  if (!h->aborted.compare_exchange_strong(expected, c.rank + 1, std::memory_order_acq_rel))
    return;
  const std::size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(h->reason, reason.data(), n);
  h->reason[n] = '\0';
  h->reason_ready.store(1, std::memory_order_release);
}

// Waits until every rank's `counters` reach `target` (a token); raises when
// the communicator is aborted, when a rank is past `target` in another
// collective, or naming the first rank that is late past the deadline or
// whose process is gone.
void wait_all(const Comm& c, Counter* counters, std::uint64_t target, double timeout_s,
              const char* what, const char* step) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  int spins = 0;
  for (int r = 0; r < c.size; ++r) {
    std::uint64_t seen;
    while ((seen = counters[r].value.load(std::memory_order_acquire)) < target) {
      if (++spins < 200) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 500));
      if (spins % 64 != 0) continue;
      const std::string aborted = abort_reason(c);
      TORCH_CHECK(aborted.empty(), "simdev_collectives: ", what, ": ", aborted);
      const std::int64_t pid = c.header()->pid[r].load(std::memory_order_acquire);
      if (pid > 0 && gone(static_cast<pid_t>(pid))) {
        TORCH_CHECK(false, "simdev_collectives: ", what, ": rank ", r, " (pid ", pid,
                    ") exited in the middle of the collective (", step, ")");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        TORCH_CHECK(false, "simdev_collectives: ", what, ": rank ", r,
                    " did not take part within the group's timeout of ", timeout_s, " s (",
                    step, "; its last step is ", describe(seen), ", this rank waits for ",
                    describe(target), ")");
      }
    }
    // Past the step waited for: rank r runs another collective (the steps of
    // one collective are taken together by every rank).
    TORCH_CHECK(seen == target || (seen >> kStepBits) == (target >> kStepBits),
                "simdev_collectives: ",
                what, ": rank ", r, " is at ", describe(seen), " while this rank waits for ",
                describe(target), ": the ranks run different collectives");
  }
}

// One step of the protocol (Note [simdev's shared-memory collectives]):
// `write(slot)` fills this rank's slot, `read()` reads the slots once every
// rank has written its own.
template <typename Write, typename Read>
void step(Comm& c, double timeout_s, const char* what, Write write, Read read) {
  Header* h = c.header();
  TORCH_CHECK(c.steps < kMaxStep, "simdev_collectives: ", what, ": more than ", kMaxStep,
              " steps in one collective");
  const std::uint64_t s = token(c.seq, c.kind, ++c.steps);
  wait_all(c, h->done, c.last, timeout_s, what, "waiting for the ranks to read the last step");
  write(c.slot(c.rank));
  h->arrived[c.rank].value.store(s, std::memory_order_release);
  c.last = s;
  wait_all(c, h->arrived, s, timeout_s, what, "waiting for the ranks' data");
  read();
  h->done[c.rank].value.store(s, std::memory_order_release);
}

// out[0, n) = the slots' elements [first, first + n) reduced in rank order.
template <typename T>
void reduce_slots(const Comm& c, T* out, std::size_t first, std::size_t n, Op op) {
  const T* in0 = reinterpret_cast<const T*>(c.slot(0)) + first;
  std::copy(in0, in0 + n, out);
  for (int r = 1; r < c.size; ++r) {
    const T* in = reinterpret_cast<const T*>(c.slot(r)) + first;
    switch (op) {
      case Op::sum:
      case Op::avg:
        for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + in[i];
        break;
      case Op::min:
        for (std::size_t i = 0; i < n; ++i) out[i] = in[i] < out[i] ? in[i] : out[i];
        break;
      case Op::max:
        for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > out[i] ? in[i] : out[i];
        break;
    }
  }
  if (op == Op::avg) {
    const T size = static_cast<T>(c.size);
    for (std::size_t i = 0; i < n; ++i) out[i] = out[i] / size;
  }
}

// all_reduce (root < 0) or reduce to `root`, in place.
template <typename T>
void reduce_chunks(Comm& c, T* data, std::size_t count, Op op, int root, double timeout_s,
                   const char* what) {
  const std::size_t per_step = kSlotBytes / sizeof(T);
  for (std::size_t offset = 0; offset < count; offset += per_step) {
    const std::size_t n = std::min(per_step, count - offset);
    step(
        c, timeout_s, what,
        [&](char* mine) { std::memcpy(mine, data + offset, n * sizeof(T)); },
        [&] {
          if (root < 0 || root == c.rank) reduce_slots(c, data + offset, 0, n, op);
        });
  }
}

// reduce_scatter: `in` has size x n elements, rank r gets the reduction of
// every rank's [r n, (r + 1) n) in `out`.
template <typename T>
void reduce_scatter(Comm& c, T* out, const T* in, std::size_t n, Op op, double timeout_s) {
  const std::size_t per_step = kSlotBytes / sizeof(T) / static_cast<std::size_t>(c.size);
  for (std::size_t offset = 0; offset < n; offset += per_step) {
    const std::size_t m = std::min(per_step, n - offset);
    step(
        c, timeout_s, "reduce_scatter",
        [&](char* mine) {
          T* slot = reinterpret_cast<T*>(mine);
          for (int d = 0; d < c.size; ++d)
            std::memcpy(slot + d * m, in + d * n + offset, m * sizeof(T));
        },
        [&] { reduce_slots(c, out + offset, static_cast<std::size_t>(c.rank) * m, m, op); });
  }
}

// broadcast from `root`, in place, any dtype (bytes).
void broadcast(Comm& c, char* data, std::size_t bytes, int root, double timeout_s) {
  for (std::size_t offset = 0; offset < bytes; offset += kSlotBytes) {
    const std::size_t n = std::min(kSlotBytes, bytes - offset);
    step(
        c, timeout_s, "broadcast",
        [&](char* mine) {
          if (c.rank == root) std::memcpy(mine, data + offset, n);
        },
        [&] {
          if (c.rank != root) std::memcpy(data + offset, c.slot(root), n);
        });
  }
}

// all_gather: rank r's `in` (bytes) into [r bytes, (r + 1) bytes) of `out`.
void all_gather(Comm& c, char* out, const char* in, std::size_t bytes, double timeout_s) {
  for (std::size_t offset = 0; offset < bytes; offset += kSlotBytes) {
    const std::size_t n = std::min(kSlotBytes, bytes - offset);
    step(
        c, timeout_s, "all_gather", [&](char* mine) { std::memcpy(mine, in + offset, n); },
        [&] {
          for (int r = 0; r < c.size; ++r) std::memcpy(out + r * bytes + offset, c.slot(r), n);
        });
  }
}

// all_to_all: rank r sends in[in_off[d], + in_splits[d]) to rank d, which
// puts it at out[out_off[r], + out_splits[r]) (elements of `elem` bytes).
// The first step exchanges every rank's splits, so that each rank knows the
// whole matrix: the ranks check it alike (a rank's send to d must be the
// size d expects) and take as many steps as the largest pair needs.
void all_to_all(Comm& c, char* out, const char* in, std::size_t elem,
                const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                double timeout_s) {
  const auto size = static_cast<std::size_t>(c.size);
  std::vector<int64_t> sends(size * size), recvs(size * size);  // [rank][peer]
  step(
      c, timeout_s, "all_to_all",
      [&](char* mine) {
        std::memcpy(mine, in_splits.data(), size * sizeof(int64_t));
        std::memcpy(mine + size * sizeof(int64_t), out_splits.data(), size * sizeof(int64_t));
      },
      [&] {
        for (std::size_t r = 0; r < size; ++r) {
          std::memcpy(&sends[r * size], c.slot(static_cast<int>(r)), size * sizeof(int64_t));
          std::memcpy(&recvs[r * size], c.slot(static_cast<int>(r)) + size * sizeof(int64_t),
                      size * sizeof(int64_t));
        }
      });
  int64_t largest = 0;
  for (std::size_t r = 0; r < size; ++r)
    for (std::size_t d = 0; d < size; ++d) {
      if (sends[r * size + d] != recvs[d * size + r]) {
        // Every rank stops here alike, after the same steps: the library
        // does not abort the communicator for it (a ValueError: run()); the
        // process group, which checked the splits before, fails its group
        // on any error of a collective it started.
        TORCH_CHECK_VALUE(false, "simdev_collectives: all_to_all: the ranks' splits disagree: "
                          "rank ", r, " sends ", sends[r * size + d], " element(s) to rank ",
                          d, ", which expects ", recvs[d * size + r]);
      }
      largest = std::max(largest, sends[r * size + d]);
    }
  std::vector<std::size_t> in_off(size), out_off(size);
  for (std::size_t d = 1; d < size; ++d) {
    in_off[d] = in_off[d - 1] + static_cast<std::size_t>(in_splits[d - 1]);
    out_off[d] = out_off[d - 1] + static_cast<std::size_t>(out_splits[d - 1]);
  }
  const std::size_t per_pair = kSlotBytes / elem / size;  // elements per pair and step
  const auto me = static_cast<std::size_t>(c.rank);
  for (std::size_t k = 0; k < static_cast<std::size_t>(largest); k += per_pair) {
    step(
        c, timeout_s, "all_to_all",
        [&](char* mine) {
          for (std::size_t d = 0; d < size; ++d) {
            const auto seg = static_cast<std::size_t>(in_splits[d]);
            if (k >= seg) continue;
            const std::size_t n = std::min(per_pair, seg - k);
            std::memcpy(mine + d * per_pair * elem, in + (in_off[d] + k) * elem, n * elem);
          }
        },
        [&] {
          for (std::size_t q = 0; q < size; ++q) {
            const auto seg = static_cast<std::size_t>(out_splits[q]);
            if (k >= seg) continue;
            const std::size_t n = std::min(per_pair, seg - k);
            std::memcpy(out + (out_off[q] + k) * elem,
                        c.slot(static_cast<int>(q)) + me * per_pair * elem, n * elem);
          }
        });
  }
}

void check_tensor(const at::Tensor& t, const char* what, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_contiguous(), "simdev_collectives: ", what,
                    " takes contiguous CPU tensors, got ", name, " on ", t.device(),
                    t.is_contiguous() ? "" : " (not contiguous)");
}

void check_float(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(float_dtype(t.scalar_type()), "simdev_collectives: ", what,
                    ": unsupported dtype ", t.scalar_type());
}

void check_root(const Comm& c, int64_t root, const char* what) {
  TORCH_CHECK_VALUE(root >= 0 && root < c.size, "simdev_collectives: ", what, ": root rank ",
                    root, " of ", c.size, " ranks");
}

// Runs `body` as collective `kind`, number `seq` of the group, on
// communicator `id`: one at a time, refused once the communicator is
// aborted, counted once done. `check(comm)` raises on a bad argument before
// anything is exchanged. A failure aborts the communicator for every rank
// (Note [simdev's shared-memory collectives]), except a ValueError that
// every rank raises at the same step (all_to_all's splits).
template <typename Check, typename Body>
void run(int64_t id, int64_t seq, int kind, Check check, Body body) {
  const char* what = kCollectives[kind];
  std::shared_ptr<Comm> c = find(id, what);
  check(*c);
  std::lock_guard<std::mutex> lock(c->busy);
  const std::string aborted = abort_reason(*c);
  TORCH_CHECK(aborted.empty(), "simdev_collectives: ", what, ": ", aborted,
              " (make a new group)");
  TORCH_CHECK_VALUE(seq > static_cast<int64_t>(c->last >> 32) &&
                        static_cast<std::uint64_t>(seq) <= kMaxSeq,
                    "simdev_collectives: ", what, ": collective number ", seq,
                    " does not follow ", describe(c->last));
  c->seq = static_cast<std::uint64_t>(seq);
  c->kind = kind;
  c->steps = 0;
  try {
    body(*c);
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::Error& e) {
    abort_comm(*c, std::string("rank ") + std::to_string(c->rank) + ": " +
                       e.what_without_backtrace());
    throw;
  } catch (const std::exception& e) {
    abort_comm(*c, std::string("rank ") + std::to_string(c->rank) + ": " + e.what());
    throw;
  }
  ++c->calls[kind];
}

}  // namespace

// The library, from Python (accelkit's slot adapter calls these; each
// collective in place or into `output`, on contiguous CPU tensors, blocking
// until this rank's part is done, raising past `timeout_s`):
// - open(name, rank, size, create) -> communicator: rank 0 with create=True
//   makes the segment, the others open it after (the store says when);
// - unlink(name): rank 0, once every rank has opened it;
// - supports(collective, op, dtype): what this library implements;
// - all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all,
//   barrier (each with `seq`, the collective's number in the group);
// - abort(comm, reason): fails the communicator for every rank;
// - calls(comm, collective): how many of that collective this communicator
//   ran (the tests' counter);
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
          // The segment's pages reserved now: ftruncate alone reserves
          // nothing on tmpfs, and a /dev/shm too small for them would raise
          // SIGBUS at the first touch of a page it cannot give, in the
          // middle of a collective. posix_fallocate sets the size too.
          if (create) {
            const int err = posix_fallocate(fd, 0, static_cast<off_t>(c->bytes));
            if (err != 0) {
              close(fd);
              TORCH_CHECK(false, "simdev_collectives: open: could not reserve ", c->bytes,
                          " bytes of shared memory for ", name, " (", size,
                          " ranks): posix_fallocate: ", std::strerror(err));
            }
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
            new (h) Header();  // zeroed counters (posix_fallocate zero-fills too)
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
          if (collective == "all_reduce" || collective == "reduce" ||
              collective == "reduce_scatter")
            return reduce_op(op) && float_dtype(dtype);
          return collective == "broadcast" || collective == "all_gather" ||
                 collective == "all_to_all" || collective == "barrier";
        });
  m.def("all_reduce(int comm, int seq, Tensor(a!) tensor, str op, float timeout_s) -> ()",
        [](int64_t id, int64_t seq, at::Tensor t, std::string op_name, double timeout_s) {
          const Op op = parse_op(op_name, "all_reduce");
          check_tensor(t, "all_reduce", "the tensor");
          check_float(t, "all_reduce");
          run(id, seq, 0, [](const Comm&) {}, [&](Comm& c) {
            const auto count = static_cast<std::size_t>(t.numel());
            if (t.scalar_type() == c10::ScalarType::Float)
              reduce_chunks(c, t.data_ptr<float>(), count, op, -1, timeout_s, "all_reduce");
            else
              reduce_chunks(c, t.data_ptr<double>(), count, op, -1, timeout_s, "all_reduce");
          });
        });
  m.def("reduce(int comm, int seq, Tensor(a!) tensor, int root, str op, float timeout_s) -> ()",
        [](int64_t id, int64_t seq, at::Tensor t, int64_t root, std::string op_name,
           double timeout_s) {
          const Op op = parse_op(op_name, "reduce");
          check_tensor(t, "reduce", "the tensor");
          check_float(t, "reduce");
          run(id, seq, 1, [&](const Comm& c) { check_root(c, root, "reduce"); }, [&](Comm& c) {
            const auto count = static_cast<std::size_t>(t.numel());
            const int r = static_cast<int>(root);
            if (t.scalar_type() == c10::ScalarType::Float)
              reduce_chunks(c, t.data_ptr<float>(), count, op, r, timeout_s, "reduce");
            else
              reduce_chunks(c, t.data_ptr<double>(), count, op, r, timeout_s, "reduce");
          });
        });
  m.def("broadcast(int comm, int seq, Tensor(a!) tensor, int root, float timeout_s) -> ()",
        [](int64_t id, int64_t seq, at::Tensor t, int64_t root, double timeout_s) {
          check_tensor(t, "broadcast", "the tensor");
          run(id, seq, 2, [&](const Comm& c) { check_root(c, root, "broadcast"); }, [&](Comm& c) {
            broadcast(c, static_cast<char*>(t.data_ptr()), t.nbytes(), static_cast<int>(root),
                      timeout_s);
          });
        });
  m.def("all_gather(int comm, int seq, Tensor(a!) output, Tensor input, float timeout_s) -> ()",
        [](int64_t id, int64_t seq, at::Tensor out, at::Tensor in, double timeout_s) {
          check_tensor(out, "all_gather", "the output");
          check_tensor(in, "all_gather", "the input");
          run(id, seq, 3, [&](const Comm& c) {
            TORCH_CHECK_VALUE(out.scalar_type() == in.scalar_type() &&
                                  out.nbytes() == in.nbytes() * static_cast<std::size_t>(c.size),
                              "simdev_collectives: all_gather: the output (", out.scalar_type(),
                              " x ", out.numel(), ") is not ", c.size, " inputs (",
                              in.scalar_type(), " x ", in.numel(), ")");
          }, [&](Comm& c) {
            all_gather(c, static_cast<char*>(out.data_ptr()),
                       static_cast<const char*>(in.data_ptr()), in.nbytes(), timeout_s);
          });
        });
  m.def("reduce_scatter(int comm, int seq, Tensor(a!) output, Tensor input, str op, "
        "float timeout_s) -> ()",
        [](int64_t id, int64_t seq, at::Tensor out, at::Tensor in, std::string op_name,
           double timeout_s) {
          const Op op = parse_op(op_name, "reduce_scatter");
          check_tensor(out, "reduce_scatter", "the output");
          check_tensor(in, "reduce_scatter", "the input");
          check_float(in, "reduce_scatter");
          const auto n = static_cast<std::size_t>(out.numel());
          run(id, seq, 4, [&](const Comm& c) {
            TORCH_CHECK_VALUE(out.scalar_type() == in.scalar_type() &&
                                  static_cast<std::size_t>(in.numel()) ==
                                      n * static_cast<std::size_t>(c.size),
                              "simdev_collectives: reduce_scatter: the input (", in.scalar_type(),
                              " x ", in.numel(), ") is not ", c.size, " outputs (",
                              out.scalar_type(), " x ", out.numel(), ")");
          }, [&](Comm& c) {
            if (in.scalar_type() == c10::ScalarType::Float)
              reduce_scatter(c, out.data_ptr<float>(), in.data_ptr<float>(), n, op, timeout_s);
            else
              reduce_scatter(c, out.data_ptr<double>(), in.data_ptr<double>(), n, op, timeout_s);
          });
        });
  m.def("barrier(int comm, int seq, float timeout_s) -> ()",
        [](int64_t id, int64_t seq, double timeout_s) {
          run(id, seq, 5, [](const Comm&) {}, [&](Comm& c) {
            step(c, timeout_s, "barrier", [](char*) {}, [] {});
          });
        });
  m.def("all_to_all(int comm, int seq, Tensor(a!) output, Tensor input, int[] output_splits, "
        "int[] input_splits, float timeout_s) -> ()",
        [](int64_t id, int64_t seq, at::Tensor out, at::Tensor in, std::vector<int64_t> out_splits,
           std::vector<int64_t> in_splits, double timeout_s) {
          check_tensor(out, "all_to_all", "the output");
          check_tensor(in, "all_to_all", "the input");
          run(id, seq, 6, [&](const Comm& c) {
            const auto size = static_cast<std::size_t>(c.size);
            TORCH_CHECK_VALUE(out.scalar_type() == in.scalar_type(),
                              "simdev_collectives: all_to_all: the output is ", out.scalar_type(),
                              ", the input ", in.scalar_type());
            TORCH_CHECK_VALUE(out_splits.size() == size && in_splits.size() == size,
                              "simdev_collectives: all_to_all: ", out_splits.size(), " and ",
                              in_splits.size(), " splits for ", size, " ranks");
            int64_t outs = 0, ins = 0;
            for (std::size_t r = 0; r < size; ++r) {
              TORCH_CHECK_VALUE(out_splits[r] >= 0 && in_splits[r] >= 0,
                                "simdev_collectives: all_to_all: a negative split");
              outs += out_splits[r];
              ins += in_splits[r];
            }
            TORCH_CHECK_VALUE(outs == out.numel() && ins == in.numel(),
                              "simdev_collectives: all_to_all: the splits sum to ", outs, " and ",
                              ins, " elements, the output has ", out.numel(), " and the input ",
                              in.numel());
          }, [&](Comm& c) {
            all_to_all(c, static_cast<char*>(out.data_ptr()),
                       static_cast<const char*>(in.data_ptr()), in.element_size(), out_splits,
                       in_splits, timeout_s);
          });
        });
  m.def("calls(int comm, str collective) -> int", [](int64_t id, std::string collective) {
    const int kind = kind_of(collective);
    TORCH_CHECK_VALUE(kind >= 0, "simdev_collectives: calls: no collective named ", collective);
    std::shared_ptr<Comm> c = find(id, "calls");
    std::lock_guard<std::mutex> lock(c->busy);
    return static_cast<int64_t>(c->calls[kind]);
  });
  // The process group's abort: a collective failed on this rank before (or
  // outside) the library; every rank's waits and later collectives raise
  // `reason` (the first abort's stays). Takes no lock a running collective
  // holds.
  m.def("abort(int comm, str reason) -> ()", [](int64_t id, std::string reason) {
    std::shared_ptr<Comm> c = find(id, "abort");
    abort_comm(*c, reason);
  });
  m.def("close(int comm) -> ()", [](int64_t id) {
    std::lock_guard<std::mutex> lock(comms_mutex);
    comms.erase(id);
  });
}
