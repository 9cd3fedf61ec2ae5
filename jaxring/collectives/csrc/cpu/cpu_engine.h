// The CPU engine of the ring collectives: ring_protocol.h's lanes, one per
// rank, run on the rank's handler thread over flag words in host memory.
//
// - The calls of one op in one execution on one set of devices meet
//   (core/meeting.h): they share flag blocks and a slot per rank for its
//   buffers. Each meeting has a ring of its own, taken from the op's idle
//   rings and given back when its last rank leaves, so no call waits for
//   another execution and no call reads another execution's data. A reused
//   ring's flags are never reset: each use has a higher epoch.
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
//   its timeout, naming it and its latest call of the op; the meeting is then
//   broken: a rank that gives up returns only once no peer's lane can touch
//   its buffers any more (XLA frees them then), a rank that arrives late fails
//   at once without touching anything, and other executions' meetings go on.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/ring_handler_common.h"
#include "core/ring_protocol.h"
#include "core/timeout.h"
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

// Whether the lowering may alias a call's output to its input (ring_primitive.py does
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
// ordinals in rank order (read only by the constructor), and the call meets
// its peers' calls of the same execution (call.key.run_id). Made on the
// handler's thread; run there or on another thread.
class CpuCall {
 public:
  CpuCall(const RingCall& call, const RankBuffers& me, xla::ffi::Span<const int64_t> devices);
  ~CpuCall();  // leaves the meeting
  CpuCall(const CpuCall&) = delete;
  CpuCall& operator=(const CpuCall&) = delete;

  // Whether every rank has arrived at this call within `wait`: the call then
  // finishes without waiting on anything but its peers' work (no other
  // collective), so a handler may run it on XLA's thread.
  bool EveryoneArrivedWithin(Clock::duration wait);
  // Runs the call to its end: "" or the error, which names the rank at fault.
  std::string Run();

 private:
  LaneCall<std::atomic<uint64_t>> Lane() const;

  const RingCall call_;
  const CpuPath path_;
  RingSlot* slot_ = nullptr;
  CpuRing* ring_ = nullptr;  // nullptr: its meeting had failed when it came (error_)
  std::string error_;  // why the call failed before it began (ring_ nullptr)
  uint64_t epoch_ = 0;
  std::unique_ptr<char[]> input_copy_;  // what peers read on an in-place ring or one-shot call
  Clock::time_point deadline_;
};

}  // namespace jaxring
