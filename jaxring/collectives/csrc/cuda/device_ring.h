// The device-synchronised CUDA ring engine (docs/CUDA_RING.md): one kernel
// launch per rank per call runs the whole schedule of ring_protocol.h, the
// ranks synchronising through epoch flags in each other's memory; the host
// side (device_engine.h) meets the other ranks of the same execution once
// per call, to publish buffer addresses and agree on the call's flags.
#pragma once

#include <string>
#include <vector>

#include "core/ring_handler_common.h"
#include "cuda/cuda_rank.h"
#include "cuda/device_engine.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// Runs one rank on `me.stream` with the device engine; `devices` are the
// ring's device ordinals in rank order. kAuto takes the one-shot path up to
// OneShotMaxBytes(ranks) of the full buffer. A ring the engine does not take
// (links, size) runs on the host-staged engine. Returns "" or the error,
// including a device-side timeout of an earlier call of this rank on this
// ring of devices, which fails the call on every rank.
std::string RunDeviceRing(const RingCall& call, const CudaRank& me,
                          const std::vector<int>& devices, DevicePath path);

// The error a device-side wait of this rank recorded on this ring of devices
// (and forgets it), or "": for callers that synchronised the stream, such as
// the harness.
std::string TakeDeviceFailure(const RingCall& call, const std::vector<int>& devices);

// Bytes of the full buffer up to which kAuto takes the one-shot path.
int64_t OneShotMaxBytes(int64_t ranks);

// Lanes (blocks of one rank's kernel) a call of this shape uses.
int64_t DeviceLanes(const RingCall& call, bool one_shot);

// How many blocks of the device ring's kernels for elements of `type` (an
// engine type: a RingCall's element_type) fit on one SM, the fewer of the sum's and
// max/min's.
int DeviceRingBlocksPerSm(xla::ffi::DataType type);

}  // namespace jaxring
