// The CPU engine (cpu_engine.h): rings, the futex-backed flag primitives, and
// one rank's call.
#include "cpu/cpu_engine.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/host_elementwise.h"
#include "core/meeting.h"

namespace jaxring {

using Word = std::atomic<uint64_t>;

// The session of one meeting (core/meeting.h): its ranks' calls in one
// execution. Reused for a later meeting once every rank has left it; its flags
// are never reset, since each use has a higher epoch than the last.
struct CpuRing : Meeting {
  explicit CpuRing(int64_t ranks) : Meeting(ranks), ranks(ranks), buffers(ranks) {
    // Word (writer, lane) of each rank's block, then the owner's "asleep on
    // that word" marks at the same offsets (CpuSync).
    const int64_t block = ranks * kMaxLanes;
    flags.reset(new Word[2 * block * ranks]);
    for (int64_t i = 0; i < 2 * block * ranks; ++i) flags[i].store(0, std::memory_order_relaxed);
    for (int64_t r = 0; r < ranks; ++r) blocks.push_back(flags.get() + 2 * block * r);
  }
  int64_t BlockWords() const { return ranks * kMaxLanes; }

  const int64_t ranks;
  std::unique_ptr<Word[]> flags;
  std::vector<Word*> blocks;
  // Rank p's buffers, written before it publishes its arrival (ring_protocol.h's
  // lanes read them only after that).
  std::vector<RankBuffers> buffers;
  // The rest is set for each use under its slot's lock.
  uint64_t epoch = 0;
  // The ranks that may still read or write a peer's buffers (in their lanes):
  // a rank that gives up waits until none is left before it returns, since
  // XLA frees its buffers then.
  int64_t running = 0;
};

// Every meeting of one traced op on one set of devices, and the rings they run on.
struct RingSlot {
  RingSlot(int64_t op_id, int64_t group, int64_t ranks) : meetings(op_id, group, ranks) {}

  Meetings<CpuRing> meetings;  // its lock guards everything below
  std::condition_variable lanes_ended;  // a meeting's `running` went down
  std::vector<std::unique_ptr<CpuRing>> rings;  // at most the meetings ever open at once
  std::vector<CpuRing*> idle;
};

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the futex waits on the low half of a 64-bit flag word");

// The push path at every size: on 8 host devices the ring was never clearly
// faster, up to 64 MiB (docs/PERFORMANCE.md, scripts/bench/bench_allreduce.py --paths).
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

using RingKey = std::vector<int64_t>;  // op id, then the ring's devices

// A meeting every rank has left: its ring serves another. Under the slot's lock.
void Close(RingSlot* slot, CpuRing* ring) {
  slot->meetings.Close(ring);
  slot->idle.push_back(ring);
}

RingSlot* SlotFor(const RingKey& key, const RingCall& call) {
  // Each handler thread finds its slots without a lock after the first call.
  thread_local std::map<RingKey, RingSlot*> cache;
  if (auto hit = cache.find(key); hit != cache.end()) return hit->second;
  static std::mutex registry_mu;
  static auto* registry = new std::map<RingKey, std::unique_ptr<RingSlot>>();
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& slot = (*registry)[key];
  if (slot == nullptr) slot = std::make_unique<RingSlot>(call.key.op_id, call.key.group, call.ranks);
  return cache[key] = slot.get();
}

// Rank `rank` comes to its meeting of execution `run_id`: the ring of that
// meeting (opened by the first rank to come, on an idle ring or a new one),
// and the epoch the call runs under; or nullptr with *error when the meeting
// already failed (the rank came too late: it must not touch its peers'
// buffers, which XLA may have freed).
CpuRing* Join(RingSlot* slot, int64_t rank, int64_t run_id, uint64_t* epoch, std::string* error) {
  Meetings<CpuRing>& meetings = slot->meetings;
  std::lock_guard<std::mutex> lock(meetings.mu());
  const MeetingKey key = meetings.NextCall(rank, run_id);
  CpuRing* ring = meetings.Find(key);
  if (ring == nullptr) {
    if (slot->idle.empty()) {
      slot->rings.push_back(std::make_unique<CpuRing>(meetings.ranks()));
      slot->idle.push_back(slot->rings.back().get());
    }
    ring = slot->idle.back();
    slot->idle.pop_back();
    ++ring->epoch;
    ring->running = 0;
    meetings.Open(key, ring);
  }
  if (!meetings.Join(ring, rank, error)) {
    if (meetings.Leave(ring)) Close(slot, ring);
    return nullptr;
  }
  ++ring->running;
  *epoch = ring->epoch;
  return ring;
}

// A rank is done with its meeting; the last to leave closes it.
void Leave(RingSlot* slot, CpuRing* ring) {
  if (!slot->meetings.Leave(ring)) return;
  std::lock_guard<std::mutex> lock(slot->meetings.mu());
  Close(slot, ring);
}

// Why a call failed, from the whole meeting: the ranks that never came to it,
// else where the peer this rank waited for stopped. Fails the meeting with it
// (unless it already failed), wakes every waiter and returns the meeting's error.
std::string Break(RingSlot* slot, CpuRing* ring, int64_t rank, const LaneOutcome& outcome) {
  std::string error;
  {
    Meetings<CpuRing>& meetings = slot->meetings;
    std::lock_guard<std::mutex> lock(meetings.mu());
    std::string why = meetings.NeverArrived(*ring, rank);
    if (why.empty()) {
      why = meetings.Stopped(*ring, rank, outcome.peer, outcome.wanted & 0xffffffffu,
                             outcome.seen >> 32 < ring->epoch ? 0 : outcome.seen & 0xffffffffu);
    }
    error = meetings.Break(ring, why);
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

template <typename T, typename Acc, Reduction R>
LaneOutcome RunLane(CpuPath path, const SchedulePlan& plan, const LaneCall<Word>& lane,
                    CpuSync& sync) {
  HostElementwise<R> ew;
  switch (path) {
    case CpuPath::kOneShot:
      return RunShotLane<T>(Shot::kOneShot, plan, lane, sync, ew);
    case CpuPath::kPush:
      return RunShotLane<T>(Shot::kPush, plan, lane, sync, ew);
    default:
      return RunRingLane<T, Acc>(plan, lane, sync, ew);
  }
}

// The reduction is a template argument, chosen here once per call: the
// per-element loops have no branch on it.
template <typename T, typename Acc>
LaneOutcome RunLaneBy(Reduction reduction, CpuPath path, const SchedulePlan& plan,
                      const LaneCall<Word>& lane, CpuSync& sync) {
  switch (reduction) {
    case Reduction::kMax:
      return RunLane<T, Acc, Reduction::kMax>(path, plan, lane, sync);
    case Reduction::kMin:
      return RunLane<T, Acc, Reduction::kMin>(path, plan, lane, sync);
    default:
      return RunLane<T, Acc, Reduction::kSum>(path, plan, lane, sync);
  }
}

// By the engines' component type (RingCall::element_type, from
// ring_handler_common.h's kElementTypes); its accumulation type is float for
// the 16-bit floats and itself for every other.
LaneOutcome RunLaneOf(const RingCall& call, CpuPath path, const SchedulePlan& plan,
                      const LaneCall<Word>& lane, CpuSync& sync) {
  using xla::ffi::DataType;
  const Reduction r = call.reduction;
  switch (call.element_type) {
    case DataType::F32:
      return RunLaneBy<float, float>(r, path, plan, lane, sync);
    case DataType::BF16:
      return RunLaneBy<Bf16, float>(r, path, plan, lane, sync);
    case DataType::F16:
      return RunLaneBy<_Float16, float>(r, path, plan, lane, sync);
    case DataType::F64:
      return RunLaneBy<double, double>(r, path, plan, lane, sync);
    case DataType::S8:
      return RunLaneBy<int8_t, int8_t>(r, path, plan, lane, sync);
    case DataType::S16:
      return RunLaneBy<int16_t, int16_t>(r, path, plan, lane, sync);
    case DataType::S64:
      return RunLaneBy<int64_t, int64_t>(r, path, plan, lane, sync);
    case DataType::U8:
      return RunLaneBy<uint8_t, uint8_t>(r, path, plan, lane, sync);
    case DataType::U16:
      return RunLaneBy<uint16_t, uint16_t>(r, path, plan, lane, sync);
    case DataType::U32:
      return RunLaneBy<uint32_t, uint32_t>(r, path, plan, lane, sync);
    case DataType::U64:
      return RunLaneBy<uint64_t, uint64_t>(r, path, plan, lane, sync);
    default:  // S32: kElementTypes has no other component type
      return RunLaneBy<int32_t, int32_t>(r, path, plan, lane, sync);
  }
}

CpuPath PathFor(const RingCall& call) {
  CpuPath path = CpuForcedPath();
  if (path == CpuPath::kAuto) {
    path = call.elements * xla::ffi::ByteWidth(call.element_type) <= CpuPushMaxBytes() ? CpuPath::kPush
                                                                       : CpuPath::kRing;
  }
  // The one-shot lanes hold at most kMaxDeviceRanks peers; the ring any number.
  return call.ranks > kMaxDeviceRanks ? CpuPath::kRing : path;
}

}  // namespace

bool RunsInPlace(Mode mode, int64_t ranks) {
  // Only a whole buffer in and a whole buffer out can share one: an all-reduce.
  const ModeTraits traits = TraitsOf(mode);
  return !traits.input_is_chunk() && !traits.output_is_chunk() && ranks <= kMaxDeviceRanks;
}

int64_t CpuPushMaxBytes() { return push_max_bytes.load(std::memory_order_relaxed); }
void SetCpuPushMaxBytes(int64_t bytes) { push_max_bytes.store(bytes); }
CpuPath CpuForcedPath() { return static_cast<CpuPath>(forced_path.load(std::memory_order_relaxed)); }
void SetCpuForcedPath(CpuPath path) { forced_path.store(static_cast<int64_t>(path)); }

CpuCall::CpuCall(const RingCall& call, const RankBuffers& me, xla::ffi::Span<const int64_t> devices)
    : call_(call), path_(PathFor(call)) {
  RingKey key{call.key.op_id};
  key.insert(key.end(), devices.begin(), devices.end());
  slot_ = SlotFor(key, call);
  ring_ = Join(slot_, call.rank, call.key.run_id, &epoch_, &error_);
  if (ring_ == nullptr) return;
  RankBuffers mine = me;
  if (me.in == me.out && path_ != CpuPath::kPush) {
    const size_t bytes = static_cast<size_t>(call.elements) * xla::ffi::ByteWidth(call.element_type);
    input_copy_.reset(new char[bytes]);
    std::memcpy(input_copy_.get(), me.in, bytes);
    mine.in = input_copy_.get();
  }
  ring_->buffers[call.rank] = mine;
  deadline_ = DeadlineFor(call.timeout_ms);
}

CpuCall::~CpuCall() {
  if (ring_ != nullptr) Leave(slot_, ring_);
}

LaneCall<Word> CpuCall::Lane() const {
  return LaneCall<Word>{call_.ranks, call_.rank, 1, 0, epoch_, ring_->blocks.data(),
                        ring_->buffers.data()};
}

bool CpuCall::EveryoneArrivedWithin(Clock::duration wait) {
  // MeetEveryone addresses at most kMaxDeviceRanks peers.
  if (ring_ == nullptr || call_.ranks > kMaxDeviceRanks) return false;
  CpuSync sync{ring_, std::min(deadline_, Clock::now() + wait), SpinsFor(call_.ranks)};
  return MeetEveryone(Lane(), sync, 0).ok;
}

std::string CpuCall::Run() {
  if (ring_ == nullptr) return error_;
  CpuSync sync{ring_, deadline_, SpinsFor(call_.ranks)};
  const SchedulePlan plan = SchedulePlan::Make(call_.mode, call_.elements, call_.ranks, call_.rank,
                                               call_.slice_elements, call_.align);
  const LaneOutcome outcome = RunLaneOf(call_, path_, plan, Lane(), sync);
  {
    std::lock_guard<std::mutex> lock(slot_->meetings.mu());
    --ring_->running;
  }
  slot_->lanes_ended.notify_all();
  if (outcome.ok) return "";
  // Whoever broke the meeting first, this rank's call fails with its reason,
  // once no peer's lane can touch this rank's buffers any more (a broken
  // meeting's lanes end at their next wait).
  const std::string error = Break(slot_, ring_, call_.rank, outcome);
  std::unique_lock<std::mutex> lock(slot_->meetings.mu());
  slot_->lanes_ended.wait(lock, [&] { return ring_->running == 0; });
  return error;
}

}  // namespace jaxring
