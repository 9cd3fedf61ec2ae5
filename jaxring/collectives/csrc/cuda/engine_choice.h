// Which CUDA engine runs a call: JAXRING_CUDA_ENGINE names it ("host", the
// default: the host-staged engine, staged_engine.h; "device", where the ring's
// GPUs are NVLink-connected, else host-staged, logged; "device-any-link", over
// PCIe too: device_ring.h).
#pragma once

#include <string>
#include <vector>

#include "core/ring_handler_common.h"
#include "cuda/cuda_rank.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// JAXRING_CUDA_ENGINE, read once ("host" when unset); any other value than
// the three above is refused by EngineChoiceError.
const std::string& EngineName();

// "" where JAXRING_CUDA_ENGINE names an engine, else what to write instead;
// free of CUDA calls, so it can be asked before any device is touched.
std::string EngineChoiceError();

// What the XLA handler runs: the engine EngineName names.
std::string RunCudaCollective(const RingCall& call, const CudaRank& me,
                              const std::vector<int>& devices);

}  // namespace jaxring
