// The CPU engine of the ring collectives: ring_protocol.h's lanes, one per
// rank, run on the rank's handler thread over flag words in host memory.
//
// - The ranks of a ring (one traced op on one set of devices) share flag
//   blocks and a slot per rank for its buffers. A rank counts its own calls
//   (the call's epoch, ring_protocol.h), writes its buffers into its slot and
//   then publishes its arrival, so a call needs no meeting of its own: the
//   k-th call of a rank meets the k-th call of the others, even when a fast
//   rank is already one execution ahead.
// - A waiting rank spins briefly, yields its core a hundred times (the rank
//   it waits for may be runnable there), then sleeps on the flag word (a
//   futex on its low half, which changes at every publish) and is woken by
//   the rank that publishes; a publish costs no system call while nobody
//   sleeps.
// - Paths (CpuPath): the push path (each rank sums its chunk of every input
//   in rank order and writes it into every output) up to CpuPushMaxBytes,
//   the pipelined ring above it. On host devices, which share one memory,
//   the push path moves the fewest bytes and the ring was never clearly
//   faster (level at 1 and 64 MiB, docs/PERFORMANCE.md), so the default
//   takes it at every size; the ring
//   runs when forced and for rings of more ranks than the one-shot lanes
//   hold (kMaxDeviceRanks). One-shot (every rank sums every input) gives the
//   push path's bits and runs when forced. All-reduces the push path serves
//   sum in place (RunsInPlace).
// - A rank that does not arrive or stops fails the call on every rank within
//   its timeout, naming it; the ring is then broken for that execution (a rank
//   that arrives late fails at once) and starts afresh at the next one.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous.h"
#include "ring_handler_common.h"
#include "ring_protocol.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

enum class CpuPath : int64_t { kAuto = 0, kRing = 1, kOneShot = 2, kPush = 3 };

// kAuto takes the push path up to this many bytes (the whole buffer), the
// ring above; settable for the benchmarks that measure the crossover.
int64_t CpuPushMaxBytes();
void SetCpuPushMaxBytes(int64_t bytes);
// What every call takes; kAuto unless a benchmark forces a path.
CpuPath CpuForcedPath();
void SetCpuForcedPath(CpuPath path);

// Whether the lowering may alias a call's output to its input (ring.py does
// for values the program computed): all-reduces of rings the push path
// serves. The push path writes only the chunk that its own rank reads of
// every buffer, so it sums in place, and the all-reduce then writes no fresh
// output pages (XLA first copies an input that is still live). The other
// paths read a peer's input while that peer writes its output: on an
// in-place call they read a copy.
bool RunsInPlace(Mode mode, int64_t ranks);

struct CpuRing;
struct RingSlot;

// Rank `call.rank`'s part of one call: `devices` are the ring's device
// ordinals in rank order (read only by the constructor). Made on the
// handler's thread, which takes the rank's next epoch; run there or on
// another thread.
class CpuCall {
 public:
  CpuCall(const RingCall& call, xla::ffi::DataType type, const RankBuffers& me,
          xla::ffi::Span<const int64_t> devices);
  ~CpuCall();  // the rank's next call may begin
  CpuCall(const CpuCall&) = delete;
  CpuCall& operator=(const CpuCall&) = delete;

  // Whether every rank has arrived at this call within `wait`: the call then
  // finishes without waiting on anything but its peers' work (no other
  // collective), so a handler may run it on XLA's thread.
  bool EveryoneArrivedWithin(Clock::duration wait);
  // Runs the call to its end: "" or the error, which names the rank at fault.
  std::string Run();

 private:
  bool PreviousFinished() const;
  void Begin();
  LaneCall<std::atomic<uint64_t>> Lane() const;
  std::string CheckPeersRanSameExecution();

  const RingCall call_;
  const xla::ffi::DataType type_;
  const CpuPath path_;
  RingSlot* slot_ = nullptr;
  CpuRing* ring_ = nullptr;  // nullptr: the call failed before it began (error_)
  std::string error_;
  uint64_t epoch_ = 0;
  RankBuffers me_{};
  std::unique_ptr<char[]> input_copy_;  // what peers read on an in-place ring or one-shot call
  bool begun_ = false;
  Clock::time_point deadline_;
};

}  // namespace jaxring
