// The synchronisation protocol of the ring engines, written once for the GPU
// (cuda/device_ring.cu, one block per lane), the CPU handler (cpu/cpu_engine.cc,
// one lane per rank on its handler thread) and host-thread tests
// (testing/protocol_test_hook.cc, which pytest drives): the same code decides what
// each rank waits for and publishes; only the primitives differ.
//
// Flags. Every rank owns a flag block of kMaxDeviceRanks x kMaxLanes 64-bit
// words in its own memory. Word (peer, lane) is written only by `peer` (its
// lane `lane`) and read only by the owner, so a rank publishes by storing into
// its neighbours' blocks and waits by polling its own. A word holds
// FlagValue(epoch, progress): the epoch (the ring's call count, agreed by the
// ranks at the call's one host rendezvous) in the high 32 bits, so a value of
// this call is above every value of the earlier calls and nothing is ever
// reset; progress 0 says "arrived" (the rank's kernel started, so its input
// is ready in its stream's order), progress n says "finished n stages" (on
// the one-shot path, 1 says "finished reading every rank's input").
//
// Lanes. Every stage is cut into the same `lanes` pieces on every rank (in
// units of 16 bytes), and lane b of a rank only ever reads what lane b of its
// neighbours wrote, so the lanes (one block each on the GPU) run the whole
// schedule independently, each with its own flags.
//
// Primitives (the Sync template argument):
//   Word                         the flag word type
//   Publish(Word* const* words, int count, uint64_t value)
//       after every data access of this lane so far: release-stores `value`
//   bool Wait(const Word* word, uint64_t value, uint64_t* seen)
//       acquire-loads until *word >= value; false at the call's deadline
//   bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value,
//                  int64_t* which, uint64_t* seen)
//       Wait for each of first[0], first[stride], ..., first[(count - 1) * stride];
//       false at the deadline, naming a word that did not get there. The GPU
//       spreads the words over the block's threads; host Syncs wait in turn
//       (WaitInTurn).
// Elementwise (the data template argument), all over one lane's range:
//   Copy(T* dst, const T* src, n), Add(const A* a, const B* b, D* dst, n),
//   SumInRankOrder(const T* const* inputs, int ranks, int64_t offset, T* dst, n)
#pragma once

#include <cstdint>
#include <string>

#include "core/ring_schedule.h"

namespace jaxring {

// Bounds of the device engine: the flag block of a rank has one word per
// (peer, lane). A larger ring takes the host-staged engine.
constexpr int kMaxDeviceRanks = 16;
constexpr int kMaxLanes = 16;
constexpr int kFlagWords = kMaxDeviceRanks * kMaxLanes;

JAXRING_HOST_DEVICE inline uint64_t FlagValue(uint64_t epoch, int64_t progress) {
  return (epoch << 32) + static_cast<uint64_t>(progress);
}

// One rank's buffers as its peers address them.
struct RankBuffers {
  const void* in;
  void* out;
  void* acc;  // partial sums; `out` when it has the accumulation type
};

// What a lane knows of its call. Word is the Sync's flag word type.
template <typename Word>
struct LaneCall {
  int64_t ranks;
  int64_t rank;
  int64_t lanes;
  int64_t lane;
  uint64_t epoch;
  Word* const* flag_blocks;     // [ranks]: each rank's flag block
  const RankBuffers* buffers;   // [ranks]: each rank's buffers

  JAXRING_HOST_DEVICE Word* WordOf(int64_t owner, int64_t writer) const {
    return flag_blocks[owner] + writer * kMaxLanes + lane;
  }
  // The word in which `writer` tells this rank its progress.
  JAXRING_HOST_DEVICE const Word* From(int64_t writer) const { return WordOf(rank, writer); }
  JAXRING_HOST_DEVICE uint64_t Value(int64_t progress) const { return FlagValue(epoch, progress); }
};

// Why a lane gave up: it waited for `peer` to reach `wanted` and saw `seen`.
struct LaneOutcome {
  bool ok;
  int64_t peer;
  uint64_t wanted;
  uint64_t seen;
};

JAXRING_HOST_DEVICE inline LaneOutcome Succeeded() { return LaneOutcome{true, -1, 0, 0}; }

// A piece of a stage or buffer: lane `lane` of `lanes` over `count` elements,
// cut in units of `unit` elements (16 bytes) so vector accesses stay aligned.
JAXRING_HOST_DEVICE inline Chunking LanePieces(int64_t count, int64_t lanes, int64_t unit) {
  return Chunking::Make(count, lanes, unit);
}

// Elements of T in a 16-byte pack, the unit lanes cut buffers in.
template <typename T>
JAXRING_HOST_DEVICE constexpr int PackElements() {
  return 16 / static_cast<int>(sizeof(T));
}

// The elements [offset, offset + n) of one stage, for the rank `me`: what
// each stage kind reads and writes, for the device lanes and the CPU handler.
template <typename T, typename Acc, typename Elementwise>
JAXRING_HOST_DEVICE void RunStagePiece(const Stage& st, int64_t offset, int64_t n,
                                       const RankBuffers& me, const RankBuffers& left,
                                       Elementwise& ew) {
  if (n == 0) return;
  const int64_t src = st.src + offset;
  const int64_t dst = st.dst + offset;
  const T* in = static_cast<const T*>(me.in) + src;
  T* out = static_cast<T*>(me.out) + dst;
  Acc* acc = static_cast<Acc*>(me.acc) + dst;
  const T* left_in = static_cast<const T*>(left.in) + src;
  const Acc* left_acc = static_cast<const Acc*>(left.acc) + src;
  switch (st.kind) {
    case StageKind::kSeed:
      ew.Copy(out, in, n);
      break;
    case StageKind::kReduceFirst:
      ew.Add(in, left_in, acc, n);
      break;
    case StageKind::kReduce:
      ew.Add(in, left_acc, acc, n);
      break;
    case StageKind::kReduceLast:
      if (st.left_is_input) {
        ew.Add(in, left_in, out, n);
      } else {
        ew.Add(in, left_acc, out, n);
      }
      break;
    case StageKind::kCopy:
      ew.Copy(out, static_cast<const T*>(left.out) + src, n);
      break;
  }
}

// One lane of the pipelined ring (ring_schedule.h): per stage, wait for the
// left neighbour's progress (and the right's before overwriting what it still
// reads), run the lane's piece, publish the progress to both neighbours.
// Returns once the right neighbour has read everything it reads from this
// rank, so the caller may hand the buffers back.
template <typename T, typename Acc, typename Sync, typename Elementwise>
JAXRING_HOST_DEVICE LaneOutcome RunRingLane(const SchedulePlan& plan,
                                            const LaneCall<typename Sync::Word>& call,
                                            Sync& sync, Elementwise& ew) {
  const int64_t left = Wrap(call.rank - 1, call.ranks);
  const int64_t right = Wrap(call.rank + 1, call.ranks);
  typename Sync::Word* const neighbours[2] = {call.WordOf(left, call.rank),
                                              call.WordOf(right, call.rank)};
  // A stage's split into lanes, redone (a division) only when the stage's
  // size changes: full slices, and chunks of a buffer that divides evenly,
  // all have one size.
  Chunking pieces = LanePieces(0, call.lanes, PackElements<T>());
  uint64_t seen = 0;
  sync.Publish(neighbours, 2, call.Value(0));
  const int64_t stages = plan.StageCount();
  for (int64_t i = 0, step = 0, k = 0; i < stages; ++i) {
    const Stage st = plan.StageAt(step, k);
    if (++k == plan.slices) k = 0, ++step;
    if (!sync.Wait(call.From(left), call.Value(st.wait_left), &seen)) {
      return LaneOutcome{false, left, call.Value(st.wait_left), seen};
    }
    if (st.wait_right > 0 && !sync.Wait(call.From(right), call.Value(st.wait_right), &seen)) {
      return LaneOutcome{false, right, call.Value(st.wait_right), seen};
    }
    if (st.count != pieces.elements) pieces = LanePieces(st.count, call.lanes, PackElements<T>());
    RunStagePiece<T, Acc>(st, pieces.Offset(call.lane), pieces.Size(call.lane),
                          call.buffers[call.rank], call.buffers[left], ew);
    sync.Publish(neighbours, 2, call.Value(i + 1));
  }
  if (!sync.Wait(call.From(right), call.Value(stages), &seen)) {
    return LaneOutcome{false, right, call.Value(stages), seen};
  }
  return Succeeded();
}

// WaitEvery of a Sync that waits for one word after another.
template <typename Sync>
JAXRING_HOST_DEVICE bool WaitInTurn(Sync& sync, const typename Sync::Word* first, int64_t stride,
                                    int count, uint64_t value, int64_t* which, uint64_t* seen) {
  for (int i = 0; i < count; ++i) {
    if (!sync.Wait(first + i * stride, value, seen)) {
      *which = i;
      return false;
    }
  }
  return true;
}

// Waits until every rank's word says `progress`: the words from rank 0 to
// rank k-1 lie kMaxLanes apart in this rank's block (LaneCall::WordOf).
template <typename Sync>
JAXRING_HOST_DEVICE LaneOutcome WaitForEveryone(const LaneCall<typename Sync::Word>& call,
                                                Sync& sync, int64_t progress) {
  int64_t which = 0;
  uint64_t seen = 0;
  if (!sync.WaitEvery(call.From(0), kMaxLanes, static_cast<int>(call.ranks), call.Value(progress),
                      &which, &seen)) {
    return LaneOutcome{false, which, call.Value(progress), seen};
  }
  return Succeeded();
}

// Tells every rank this lane's `progress` and waits until every rank's says
// the same. Publishing a value twice is harmless, so a caller may meet at 0
// (arrival) ahead of a lane that meets there again (the CPU engine does, to
// learn whether its peers are already there).
template <typename Sync>
JAXRING_HOST_DEVICE LaneOutcome MeetEveryone(const LaneCall<typename Sync::Word>& call, Sync& sync,
                                             int64_t progress) {
  typename Sync::Word* everyone[kMaxDeviceRanks];
  for (int64_t p = 0; p < call.ranks; ++p) everyone[p] = call.WordOf(p, call.rank);
  sync.Publish(everyone, static_cast<int>(call.ranks), call.Value(progress));
  return WaitForEveryone(call, sync, progress);
}

// Meets every rank at its arrival, then reads every rank's input (only then:
// a rank may publish its buffers with its arrival, as the CPU engine does).
template <typename T, typename Sync>
JAXRING_HOST_DEVICE LaneOutcome ArriveForInputs(const LaneCall<typename Sync::Word>& call,
                                                Sync& sync, const T** inputs) {
  const LaneOutcome outcome = MeetEveryone(call, sync, 0);
  if (outcome.ok) {
    for (int64_t p = 0; p < call.ranks; ++p) inputs[p] = static_cast<const T*>(call.buffers[p].in);
  }
  return outcome;
}

// The lanes that meet every rank twice, for small buffers (and, on host
// devices, every size): once every rank has arrived, each reads every rank's
// input and adds them in rank order (so all replicas are bitwise identical),
// then waits until every rank has finished with its buffers.
//   kOneShot: each rank sums the whole buffer into its own output.
//   kPush: each rank sums its own chunk and writes it into every rank's
//     output (all_gather: its input into every output): the same bits, and a
//     k-th of one-shot's reads, so where the ranks share one memory (host
//     devices) the path that moves the fewest bytes.
// `plan` gives the chunks, as for the ring.
enum class Shot { kOneShot, kPush };

// All-reduce pushes its sum a block at a time, copied from its own output
// while it is still in cache.
constexpr int64_t kPushBlockBytes = 1 << 20;

template <typename T, typename Word, typename Elementwise>
JAXRING_HOST_DEVICE void SumEveryInput(const SchedulePlan& plan, const LaneCall<Word>& call,
                                       const T* const* inputs, Elementwise& ew) {
  const int unit = PackElements<T>();
  T* out = static_cast<T*>(call.buffers[call.rank].out);
  const Chunking& chunks = plan.chunks;
  if (TraitsOf(plan.mode).input_is_chunk()) {
    // Rank p's input is chunk p of the output.
    for (int64_t p = 0; p < call.ranks; ++p) {
      const Chunking pieces = LanePieces(chunks.Size(p), call.lanes, unit);
      ew.Copy(out + chunks.Offset(p) + pieces.Offset(call.lane),
              inputs[p] + pieces.Offset(call.lane), pieces.Size(call.lane));
    }
    return;
  }
  // All-reduce: the whole buffer; reduce-scatter: this rank's chunk.
  const bool scatter = TraitsOf(plan.mode).output_is_chunk();
  const int64_t begin = scatter ? chunks.Offset(call.rank) : 0;
  const Chunking pieces =
      LanePieces(scatter ? chunks.Size(call.rank) : chunks.elements, call.lanes, unit);
  ew.SumInRankOrder(inputs, static_cast<int>(call.ranks), begin + pieces.Offset(call.lane),
                    out + pieces.Offset(call.lane), pieces.Size(call.lane));
}

template <typename T, typename Word, typename Elementwise>
JAXRING_HOST_DEVICE void PushOwnChunk(const SchedulePlan& plan, const LaneCall<Word>& call,
                                      const T* const* inputs, Elementwise& ew) {
  const Chunking& chunks = plan.chunks;
  const int64_t begin = chunks.Offset(call.rank);
  const Chunking pieces = LanePieces(chunks.Size(call.rank), call.lanes, PackElements<T>());
  const int64_t offset = pieces.Offset(call.lane), n = pieces.Size(call.lane);
  T* out = static_cast<T*>(call.buffers[call.rank].out);
  if (TraitsOf(plan.mode).output_is_chunk()) {
    ew.SumInRankOrder(inputs, static_cast<int>(call.ranks), begin + offset, out + offset, n);
    return;
  }
  const bool reduce = TraitsOf(plan.mode).reduces;
  const int64_t block = reduce ? kPushBlockBytes / static_cast<int64_t>(sizeof(T)) : n;
  for (int64_t done = 0; done < n; done += block) {
    const int64_t at = begin + offset + done, count = Min(block, n - done);
    const T* mine = inputs[call.rank] + offset + done;
    if (reduce) {
      ew.SumInRankOrder(inputs, static_cast<int>(call.ranks), at, out + at, count);
      mine = out + at;
    }
    for (int64_t p = 0; p < call.ranks; ++p) {
      if (p != call.rank || !reduce) ew.Copy(static_cast<T*>(call.buffers[p].out) + at, mine, count);
    }
  }
}

template <typename T, typename Sync, typename Elementwise>
JAXRING_HOST_DEVICE LaneOutcome RunShotLane(Shot shot, const SchedulePlan& plan,
                                            const LaneCall<typename Sync::Word>& call,
                                            Sync& sync, Elementwise& ew) {
  const T* inputs[kMaxDeviceRanks];
  if (LaneOutcome outcome = ArriveForInputs(call, sync, inputs); !outcome.ok) return outcome;
  if (shot == Shot::kPush) {
    PushOwnChunk(plan, call, inputs, ew);
  } else {
    SumEveryInput(plan, call, inputs, ew);
  }
  return MeetEveryone(call, sync, 1);
}

// The error of a lane that gave up, for the handler to return: which rank
// never arrived in this call, or where it stopped.
inline std::string DescribeLaneFailure(int64_t rank, const LaneOutcome& outcome) {
  const uint64_t epoch = outcome.wanted >> 32;
  const uint64_t seen_epoch = outcome.seen >> 32;
  const int64_t seen_progress = static_cast<int64_t>(outcome.seen & 0xffffffffu);
  const int64_t wanted_progress = static_cast<int64_t>(outcome.wanted & 0xffffffffu);
  std::string what;
  if (seen_epoch < epoch) {
    what = "rank " + std::to_string(outcome.peer) +
           " never arrived (its last word is from call " + std::to_string(seen_epoch) +
           ", this is call " + std::to_string(epoch) + ")";
  } else {
    what = "rank " + std::to_string(outcome.peer) + " stopped at stage " +
           std::to_string(seen_progress) + "; rank " + std::to_string(rank) +
           " needed stage " + std::to_string(wanted_progress);
  }
  return "jaxring device ring: rank " + std::to_string(rank) +
         " timed out on the device: " + what +
         ". Every device of the axis must run the same collectives in the same "
         "order; raise the timeout with JAXRING_TIMEOUT_S or timeout= if a rank is "
         "legitimately slow.";
}

}  // namespace jaxring
