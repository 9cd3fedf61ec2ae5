// The host-staged engine's session policy (staged_engine.cu), free of CUDA:
// the handlers of one call meet (core/meeting.h), publish a state each, and
// then carry each rank's progress through the ring schedule, a rank waiting
// on the host until its neighbours have enqueued the stages it needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/call_key.h"
#include "core/ring_schedule.h"
#include "core/timeout.h"

namespace jaxring {

struct StagedPlace;
struct StagedSession;

// One rank's part of a meeting, from its construction (which counts the
// call's occurrence) to its destruction (which leaves the meeting).
class StagedMeeting {
 public:
  StagedMeeting(const CallKey& key, int64_t ranks, int64_t rank);
  ~StagedMeeting();
  StagedMeeting(const StagedMeeting&) = delete;
  StagedMeeting& operator=(const StagedMeeting&) = delete;

  // Publishes this rank's state and waits for every rank, until `deadline`:
  // "" or the meeting's error (every rank gets it; a rank that comes after
  // the meeting failed gets it at once).
  std::string Arrive(void* state, Clock::time_point deadline);
  // Waits until `peer`'s progress reaches `count`.
  std::string WaitFor(int64_t peer, int64_t count, Clock::time_point deadline);
  // Marks one more stage of this rank done.
  void Advance();
  // Fails the meeting (this rank hit an error); wakes every waiter.
  void Fail(const std::string& error);
  // The state `peer` published; once Arrive succeeded.
  void* state(int64_t peer) const;

 private:
  std::string Error() const;
  void WakeEveryone();

  const int64_t rank_;
  StagedPlace* place_ = nullptr;
  StagedSession* session_ = nullptr;
  std::string error_;  // why this rank cannot meet its peers at all
};

// One rank's walk through `stages` once every rank has arrived: before each
// stage it waits for the neighbours' progress the stage needs and has `steps`
// order its work after theirs (steps.AfterLeft(count), steps.AfterRight(count))
// and enqueue it (steps.Run(i): "" or an error, which fails the meeting); at
// the end it keeps its state alive until both neighbours are done with it.
template <typename Steps>
std::string WalkSchedule(StagedMeeting& meeting, const std::vector<Stage>& stages, int64_t left, int64_t right,
                         Clock::time_point deadline, Steps& steps) {
  std::string error;
  for (size_t i = 0; i < stages.size() && error.empty(); ++i) {
    const Stage& stage = stages[i];
    error = meeting.WaitFor(left, stage.wait_left, deadline);
    if (!error.empty()) break;
    steps.AfterLeft(stage.wait_left);
    if (stage.wait_right > 0) {
      error = meeting.WaitFor(right, stage.wait_right, deadline);
      if (!error.empty()) break;
      steps.AfterRight(stage.wait_right);
    }
    error = steps.Run(i);
    if (!error.empty()) {
      meeting.Fail(error);
      break;
    }
    meeting.Advance();
  }
  // This rank's buffers must outlive the right neighbour's reads of them (XLA
  // may reuse them once this rank's work is done).
  const int64_t total = FinalWaitRight(stages);
  if (error.empty()) error = meeting.WaitFor(right, total, deadline);
  if (error.empty()) {
    steps.AfterRight(total);
    // One more step of progress says "I touch no neighbour's state any more";
    // this rank's state must outlive both neighbours' waits on it.
    meeting.Advance();
    error = meeting.WaitFor(left, total + 1, deadline);
  }
  if (error.empty()) error = meeting.WaitFor(right, total + 1, deadline);
  return error;
}

}  // namespace jaxring
