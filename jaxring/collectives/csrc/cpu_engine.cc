// The CPU engine (cpu_engine.h): rings, the futex-backed flag primitives, and
// one rank's call.
#include "cpu_engine.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "host_elementwise.h"
#include "rendezvous.h"

namespace jaxring {

using Word = std::atomic<uint64_t>;

// One traced op on one set of devices, until a failure breaks it.
struct CpuRing {
  explicit CpuRing(int64_t ranks) : ranks(ranks), buffers(ranks), states(new RankState[ranks]) {
    // Word (writer, lane) of each rank's block, then the owner's "asleep on
    // that word" marks at the same offsets (CpuSync).
    const int64_t block = ranks * kMaxLanes;
    flags.reset(new Word[2 * block * ranks]);
    for (int64_t i = 0; i < 2 * block * ranks; ++i) flags[i].store(0, std::memory_order_relaxed);
    for (int64_t r = 0; r < ranks; ++r) blocks.push_back(flags.get() + 2 * block * r);
  }
  int64_t BlockWords() const { return ranks * kMaxLanes; }

  struct alignas(64) RankState {
    // One call of a rank at a time (they share its slot and flags): call e
    // begins once call e - 1 has finished.
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> finished{0};
    std::atomic<uint64_t> started{0};  // the last call it began, for the error
    // The execution of its call e at [e % 2], written before it arrives: a
    // peer still in call e reads it while this rank may be in call e + 1.
    int64_t run_ids[2] = {0, 0};
  };

  const int64_t ranks;
  std::unique_ptr<Word[]> flags;
  std::vector<Word*> blocks;
  // Rank p's buffers of its current call, written before it publishes its
  // arrival (ring_protocol.h's lanes read them only after that).
  std::vector<RankBuffers> buffers;
  std::unique_ptr<RankState[]> states;
  std::atomic<bool> broken{false};
  std::string broken_why;  // written before `broken` is set
};

// Every ring an op ran on: its current CpuRing and the executions that broke
// earlier ones. Rings are never freed (a rank may still hold a broken one).
struct RingSlot {
  std::atomic<CpuRing*> current{nullptr};
  std::atomic<bool> ever_failed{false};
  std::mutex mu;  // the rest; taken only once something failed
  std::vector<std::unique_ptr<CpuRing>> rings;
  std::map<int64_t, std::string> failed_runs;
};

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the futex waits on the low half of a 64-bit flag word");

// The push path at every size: on 8 host devices the ring was never clearly
// faster, up to 64 MiB (docs/PERFORMANCE.md, scripts/bench_allreduce.py --paths).
std::atomic<int64_t> push_max_bytes{std::numeric_limits<int64_t>::max()};
std::atomic<int64_t> forced_path{static_cast<int64_t>(CpuPath::kAuto)};

// Yields before a waiter sleeps: with more ranks than cores, the rank it
// waits for is often runnable on its own core, and a yield hands that core
// over at once where a futex sleep and wake-up would cost two context
// switches (docs/PERFORMANCE.md: 1.0x psum at 4 KiB-4 MiB without, 1.2-1.8x
// with 10-1000).
constexpr int kYieldsBeforeSleep = 100;

// How long a waiter sleeps at most before it looks whether its ring broke
// (the rank that breaks it also wakes every waiter; this covers a wake that
// came just before the sleep).
constexpr auto kBrokenPoll = std::chrono::milliseconds(10);

uint32_t* LowHalf(const Word* word) {
  return reinterpret_cast<uint32_t*>(const_cast<Word*>(word));
}

void FutexWake(const Word* word) {
  syscall(SYS_futex, LowHalf(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(const Word* word, uint32_t low_half, Clock::duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec limit{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, LowHalf(word), FUTEX_WAIT_PRIVATE, low_half, &limit, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Release-stores, acquire-loads; waits spin `spins` times, yield, then sleep.
struct CpuSync {
  using Word = jaxring::Word;
  const CpuRing* ring;
  Clock::time_point deadline;
  int spins;

  Word* SleepMark(const Word* word) const {
    return const_cast<Word*>(word) + ring->BlockWords();
  }

  void Publish(Word* const* words, int count, uint64_t value) {
    for (int i = 0; i < count; ++i) {
      // seq_cst pairs with the sleeper's mark-then-recheck: either it sees
      // this value or this sees its mark.
      words[i]->store(value, std::memory_order_seq_cst);
      if (SleepMark(words[i])->load(std::memory_order_seq_cst) != 0) FutexWake(words[i]);
    }
  }

  bool Wait(const Word* word, uint64_t value, uint64_t* seen) {
    for (int i = 0; i < spins; ++i) {
      *seen = word->load(std::memory_order_acquire);
      if (*seen >= value) return true;
      CpuRelax();
    }
    for (int i = 0; i < kYieldsBeforeSleep; ++i) {
      *seen = word->load(std::memory_order_acquire);
      if (*seen >= value) return true;
      std::this_thread::yield();
    }
    Word* mark = SleepMark(word);
    for (;;) {
      mark->store(1, std::memory_order_seq_cst);
      *seen = word->load(std::memory_order_seq_cst);
      if (*seen >= value) {
        mark->store(0, std::memory_order_relaxed);
        return true;
      }
      const auto now = Clock::now();
      if (now >= deadline || ring->broken.load(std::memory_order_acquire)) {
        mark->store(0, std::memory_order_relaxed);
        return false;
      }
      FutexWait(word, static_cast<uint32_t>(*seen), std::min<Clock::duration>(deadline - now, kBrokenPoll));
    }
  }

  bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value, int64_t* which,
                 uint64_t* seen) {
    return WaitInTurn(*this, first, stride, count, value, which, seen);
  }
};

constexpr size_t kMaxRememberedFailedRuns = 64;

using RingKey = std::vector<int64_t>;  // op id, then the ring's devices

RingSlot* SlotFor(const RingKey& key, int64_t ranks) {
  // Each handler thread finds its slots without a lock after the first call.
  thread_local std::map<RingKey, RingSlot*> cache;
  if (auto hit = cache.find(key); hit != cache.end()) return hit->second;
  static std::mutex registry_mu;
  static auto* registry = new std::map<RingKey, std::unique_ptr<RingSlot>>();
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& slot = (*registry)[key];
  if (slot == nullptr) {
    slot = std::make_unique<RingSlot>();
    slot->rings.push_back(std::make_unique<CpuRing>(ranks));
    slot->current.store(slot->rings.back().get(), std::memory_order_release);
  }
  return cache[key] = slot.get();
}

// The ring this call runs on, or nullptr with *error when its execution
// already failed.
CpuRing* RingFor(RingSlot* slot, int64_t ranks, int64_t run_id, std::string* error) {
  if (!slot->ever_failed.load(std::memory_order_acquire)) {
    return slot->current.load(std::memory_order_acquire);
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  if (auto failed = slot->failed_runs.find(run_id); failed != slot->failed_runs.end()) {
    *error = failed->second;
    return nullptr;
  }
  CpuRing* ring = slot->current.load(std::memory_order_acquire);
  if (ring->broken.load(std::memory_order_acquire)) {
    // A new execution: every rank's first call of it comes here and finds the fresh ring.
    slot->rings.push_back(std::make_unique<CpuRing>(ranks));
    ring = slot->rings.back().get();
    slot->current.store(ring, std::memory_order_release);
  }
  return ring;
}

std::string Describe(const RingCall& call) {
  return "jaxring collective (op id " + std::to_string(call.key.op_id) + ", ring group " +
         std::to_string(call.key.group) + ", " + std::to_string(call.ranks) + " ranks)";
}

// Why call `epoch` failed, from the whole ring: the ranks that never began
// it, else where the peer this rank waited for stopped.
std::string DescribeTimeout(const RingCall& call, const CpuRing& ring, uint64_t epoch,
                            const LaneOutcome& outcome) {
  std::string missing;
  for (int64_t p = 0; p < ring.ranks; ++p) {
    if (ring.states[p].started.load(std::memory_order_acquire) < epoch) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
  }
  const std::string advice =
      ". Every device of the axis must run the same collectives in the same order; raise the "
      "timeout with JAXRING_TIMEOUT_S or timeout= if a rank is legitimately slow.";
  if (!missing.empty()) {
    return Describe(call) + ": timed out waiting for rank(s) [" + missing +
           "] that never arrived" + advice;
  }
  return Describe(call) + ": timed out waiting for rank " + std::to_string(outcome.peer) +
         " to reach stage " + std::to_string(outcome.wanted & 0xffffffffu) + " (it is at " +
         std::to_string(outcome.seen >> 32 < epoch ? 0 : outcome.seen & 0xffffffffu) + ")" +
         advice;
}

// Fails `ring` (with `why`, unless it already failed) and execution `run_id`,
// wakes every waiter and returns the ring's error.
std::string Break(RingSlot* slot, CpuRing* ring, int64_t run_id, const std::string& why) {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(slot->mu);
    if (!ring->broken.load(std::memory_order_relaxed)) {
      ring->broken_why = why;
      ring->broken.store(true, std::memory_order_release);
    }
    if (slot->failed_runs.size() == kMaxRememberedFailedRuns) {
      slot->failed_runs.erase(slot->failed_runs.begin());
    }
    slot->failed_runs.emplace(run_id, ring->broken_why);
    slot->ever_failed.store(true, std::memory_order_release);
    error = ring->broken_why;
  }
  for (int64_t owner = 0; owner < ring->ranks; ++owner) {
    for (int64_t writer = 0; writer < ring->ranks; ++writer) {
      FutexWake(ring->blocks[owner] + writer * kMaxLanes);
    }
  }
  return error;
}

// Spinning helps only where every rank has a core to itself.
int SpinsFor(int64_t ranks) {
  static const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return cores > ranks ? 4000 : 64;
}

template <typename T, typename Acc>
LaneOutcome RunLane(CpuPath path, const SchedulePlan& plan, const LaneCall<Word>& lane,
                    CpuSync& sync) {
  HostElementwise ew;
  switch (path) {
    case CpuPath::kOneShot:
      return RunShotLane<T>(Shot::kOneShot, plan, lane, sync, ew);
    case CpuPath::kPush:
      return RunShotLane<T>(Shot::kPush, plan, lane, sync, ew);
    default:
      return RunRingLane<T, Acc>(plan, lane, sync, ew);
  }
}

LaneOutcome RunLaneOf(xla::ffi::DataType type, CpuPath path, const SchedulePlan& plan,
                      const LaneCall<Word>& lane, CpuSync& sync) {
  switch (type) {
    case xla::ffi::DataType::F32:
      return RunLane<float, float>(path, plan, lane, sync);
    case xla::ffi::DataType::BF16:
      return RunLane<Bf16, float>(path, plan, lane, sync);
    case xla::ffi::DataType::F16:
      return RunLane<_Float16, float>(path, plan, lane, sync);
    default:  // S32: DescribeCall refused every other type
      return RunLane<int32_t, int32_t>(path, plan, lane, sync);
  }
}

CpuPath PathFor(const RingCall& call, xla::ffi::DataType type) {
  CpuPath path = CpuForcedPath();
  if (path == CpuPath::kAuto) {
    path = call.elements * ElementBytes(type) <= CpuPushMaxBytes() ? CpuPath::kPush
                                                                       : CpuPath::kRing;
  }
  // The one-shot lanes hold at most kMaxDeviceRanks peers; the ring any number.
  return call.ranks > kMaxDeviceRanks ? CpuPath::kRing : path;
}

}  // namespace

bool RunsInPlace(Mode mode, int64_t ranks) {
  return mode == Mode::kAllReduce && ranks <= kMaxDeviceRanks;
}

int64_t CpuPushMaxBytes() { return push_max_bytes.load(std::memory_order_relaxed); }
void SetCpuPushMaxBytes(int64_t bytes) { push_max_bytes.store(bytes); }
CpuPath CpuForcedPath() { return static_cast<CpuPath>(forced_path.load(std::memory_order_relaxed)); }
void SetCpuForcedPath(CpuPath path) { forced_path.store(static_cast<int64_t>(path)); }

CpuCall::CpuCall(const RingCall& call, xla::ffi::DataType type, const RankBuffers& me,
                 xla::ffi::Span<const int64_t> devices)
    : call_(call), type_(type), path_(PathFor(call, type)) {
  RingKey key{call.key.op_id};
  key.insert(key.end(), devices.begin(), devices.end());
  slot_ = SlotFor(key, call.ranks);
  ring_ = RingFor(slot_, call.ranks, call.key.run_id, &error_);
  if (ring_ == nullptr) return;
  epoch_ = ring_->states[call.rank].calls.fetch_add(1, std::memory_order_acq_rel) + 1;
  me_ = me;
  if (me.in == me.out && path_ != CpuPath::kPush) {
    const size_t bytes = static_cast<size_t>(call.elements) * ElementBytes(type);
    input_copy_.reset(new char[bytes]);
    std::memcpy(input_copy_.get(), me.in, bytes);
    me_.in = input_copy_.get();
  }
  deadline_ = DeadlineFor(call.timeout_ms);
}

bool CpuCall::PreviousFinished() const {
  return ring_->states[call_.rank].finished.load(std::memory_order_acquire) + 1 >= epoch_;
}

// The rank's previous call of this op is over (it is, unless XLA runs one op
// twice at once on a device, never seen): take over its slot and flags.
void CpuCall::Begin() {
  if (begun_) return;
  for (int i = 0; !PreviousFinished(); ++i) {
    if (i < kYieldsBeforeSleep) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  CpuRing::RankState& state = ring_->states[call_.rank];
  state.started.store(epoch_, std::memory_order_release);
  state.run_ids[epoch_ % 2] = call_.key.run_id;
  ring_->buffers[call_.rank] = me_;
  begun_ = true;
}

CpuCall::~CpuCall() {
  if (begun_) ring_->states[call_.rank].finished.store(epoch_, std::memory_order_release);
}

LaneCall<Word> CpuCall::Lane() const {
  return LaneCall<Word>{call_.ranks, call_.rank, 1, 0, epoch_, ring_->blocks.data(),
                        ring_->buffers.data()};
}

bool CpuCall::EveryoneArrivedWithin(Clock::duration wait) {
  // MeetEveryone addresses at most kMaxDeviceRanks peers.
  // Nor while the previous call still runs, which would hold XLA's thread.
  if (ring_ == nullptr || call_.ranks > kMaxDeviceRanks || !PreviousFinished()) return false;
  Begin();
  CpuSync sync{ring_, std::min(deadline_, Clock::now() + wait), SpinsFor(call_.ranks)};
  return MeetEveryone(Lane(), sync, 0).ok;
}

std::string CpuCall::Run() {
  if (ring_ == nullptr) return error_;
  Begin();
  CpuSync sync{ring_, deadline_, SpinsFor(call_.ranks)};
  const SchedulePlan plan = SchedulePlan::Make(call_.mode, call_.elements, call_.ranks, call_.rank,
                                               call_.slice_elements, call_.align);
  const LaneOutcome outcome = RunLaneOf(type_, path_, plan, Lane(), sync);
  if (outcome.ok) return CheckPeersRanSameExecution();
  // Whoever broke the ring first, this rank's execution is failed too.
  return Break(slot_, ring_, call_.key.run_id, DescribeTimeout(call_, *ring_, epoch_, outcome));
}

// The k-th call of a rank meets the k-th call of its peers; XLA runs the
// executions of a program in order on each device, so those are calls of
// one execution. Were it otherwise, the ranks would have summed other
// executions' data: fail rather than return it.
std::string CpuCall::CheckPeersRanSameExecution() {
  // The ring waited for its two neighbours' progress in this call, the other
  // paths for everyone's.
  const int64_t left = Wrap(call_.rank - 1, call_.ranks), right = Wrap(call_.rank + 1, call_.ranks);
  for (int64_t peer = 0; peer < call_.ranks; ++peer) {
    if (path_ == CpuPath::kRing && peer != left && peer != right) continue;
    const int64_t theirs = ring_->states[peer].run_ids[epoch_ % 2];
    if (theirs != call_.key.run_id) {
      return Break(slot_, ring_, call_.key.run_id,
                   Describe(call_) + ": rank " + std::to_string(call_.rank) + " (execution " +
                       std::to_string(call_.key.run_id) + ") met rank " + std::to_string(peer) +
                       " in another execution (" + std::to_string(theirs) +
                       "); its result mixes two executions' data. Run executions that use this "
                       "op one after the other.");
    }
  }
  return "";
}

}  // namespace jaxring
