// The device-synchronised CUDA ring engine (docs/CUDA_RING.md): one kernel
// launch per rank per call runs the whole schedule of ring_protocol.h, the
// ranks synchronising through epoch flags in each other's memory; the host
// meets the other ranks once per call, to publish buffer addresses.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda_ring.h"
#include "ring_handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

enum class DevicePath { kAuto, kRing, kOneShot };

// Runs one rank on `me.stream` with the device engine. kAuto takes the
// one-shot path up to OneShotMaxBytes(ranks) of the full buffer. Returns ""
// or the error, including a device-side timeout of an earlier call of this
// ring on this rank that the kernel recorded since.
std::string RunDeviceRing(const RingCall& call, xla::ffi::DataType type, const CudaRank& me,
                          DevicePath path);

// The error a device-side wait of this ring's rank recorded (and forgets
// it), or "": for callers that synchronised the stream, such as the harness.
std::string TakeDeviceFailure(const RingCall& call);

// Bytes of the full buffer up to which kAuto takes the one-shot path.
int64_t OneShotMaxBytes(int64_t ranks);

// Lanes (blocks of one rank's kernel) a call of this shape uses.
int64_t DeviceLanes(const RingCall& call, xla::ffi::DataType type, bool one_shot);

// How many blocks of the device ring's kernel fit on one SM of `device`.
int DeviceRingBlocksPerSm(xla::ffi::DataType type);

// What the XLA handler runs: the engine JAXRING_CUDA_ENGINE names ("host",
// the default, or "device"); the device engine falls back to the
// host-staged one for rings whose GPUs cannot map each other's memory or
// with more than kMaxDeviceRanks ranks. `devices` are the ring's device
// ordinals in rank order.
std::string RunCudaCollective(const RingCall& call, xla::ffi::DataType type,
                              const CudaRank& me, const std::vector<int>& devices);

}  // namespace jaxring
