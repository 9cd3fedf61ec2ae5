// The host-staged CUDA engine without CUDA, for its host-thread tests
// (module_engine_test.cc, staged_tsan.cc): its meeting and walk through the
// schedule (cuda/staged_meeting.h) as cuda/staged_engine.cu runs them, the
// stages done on float32 host memory by the call's reduction.
#pragma once

#include <string>
#include <vector>

#include "core/host_elementwise.h"
#include "core/ring_handler_common.h"
#include "core/ring_schedule.h"
#include "core/timeout.h"
#include "cuda/staged_meeting.h"

namespace jaxring {

// One rank's float32 buffers in host memory; its partial sums are in `out`,
// as a 4-byte all-reduce's are on the GPU (core/ring_handler_common.h).
struct HostRank {
  const float* in;
  float* out;
};

// The host-staged engine's stages (RunStage in cuda/staged_engine.cu) on host
// memory, each done when it is enqueued: what its stream does once the
// neighbours' events it waits on have completed.
template <Reduction R>
struct HostStagedSteps {
  const std::vector<Stage>& stages;
  const HostRank& me;
  const HostRank& left;

  void AfterLeft(int64_t) {}
  void AfterRight(int64_t) {}
  std::string Run(size_t i) {
    const Stage& st = stages[i];
    const float* in = me.in + st.src;
    float* out = me.out + st.dst;
    const float* left_operand = st.kind == StageKind::kReduceFirst || st.left_is_input ? left.in : left.out;
    for (int64_t j = 0; j < st.count; ++j) {
      switch (st.kind) {
        case StageKind::kSeed:
          out[j] = in[j];
          break;
        case StageKind::kCopy:
          out[j] = left.out[st.src + j];
          break;
        default:  // kReduceFirst, kReduce, kReduceLast: partial sums live in `out`
          out[j] = Combine<R>::Of(left_operand[st.src + j], in[j]);
      }
    }
    return "";
  }
};

// One rank's all-reduce call of `in` into `out` (float32), as RunTyped in
// cuda/staged_engine.cu makes it: "" or the error.
inline std::string RunHostStaged(const RingCall& call, const float* in, float* out) {
  const HostRank me{in, out};
  const auto stages = BuildSchedule(call.mode, call.elements, call.ranks, call.rank, call.slice_elements, call.align);
  StagedMeeting meeting(call.key, call.ranks, call.rank);
  const auto deadline = DeadlineFor(call.timeout_ms);
  std::string error = meeting.Arrive(const_cast<HostRank*>(&me), deadline);
  if (!error.empty()) return error;
  const int64_t left = Mod(call.rank - 1, call.ranks), right = Mod(call.rank + 1, call.ranks);
  const HostRank& left_rank = *static_cast<const HostRank*>(meeting.state(left));
  switch (call.reduction) {
    case Reduction::kMax: {
      HostStagedSteps<Reduction::kMax> steps{stages, me, left_rank};
      return WalkSchedule(meeting, stages, left, right, deadline, steps);
    }
    case Reduction::kMin: {
      HostStagedSteps<Reduction::kMin> steps{stages, me, left_rank};
      return WalkSchedule(meeting, stages, left, right, deadline, steps);
    }
    default: {
      HostStagedSteps<Reduction::kSum> steps{stages, me, left_rank};
      return WalkSchedule(meeting, stages, left, right, deadline, steps);
    }
  }
}

}  // namespace jaxring
