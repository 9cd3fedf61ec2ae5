// The host-staged CUDA engine, kept apart from its XLA binding
// (cuda_handler.cc) so that the engine can be driven without XLA, several
// ranks on one GPU (testing/ring_harness.cu).
#pragma once

#include <string>

#include "core/ring_handler_common.h"
#include "cuda/cuda_rank.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// Whether `device` can read `peer`'s memory; enables peer access on the
// first ask for each ordered pair (`device` must be current).
bool PeerReadable(int device, int peer);

// Runs one rank of the ring on `me.stream` (elements of call.element_type,
// reduced by call.reduction); returns "" or the error. Blocks the calling
// host thread until every rank has enqueued its work (never until the GPU
// work finishes).
std::string RunCudaRing(const RingCall& call, const CudaRank& me);

}  // namespace jaxring
