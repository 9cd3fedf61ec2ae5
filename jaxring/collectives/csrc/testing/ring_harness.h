// Virtual-rank harness: k ranks of either CUDA engine on one GPU, each with
// its own stream and buffers, entered from its own host thread as XLA enters
// the handler. For scripts/gpu/check_cuda_ring.py and scripts/gpu/bench_cuda_ring.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/reduction.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

struct HarnessCase {
  std::string engine;  // "host" or "device"
  std::string path;    // device engine: "auto", "ring" or "one_shot"
  int64_t mode;
  xla::ffi::DataType type;  // the buffers' (a type of core's kElementTypes)
  Reduction reduction;
  int64_t ranks;
  int64_t elements;  // of the full (all-reduced) buffer
  int64_t slice_bytes;
  double timeout_s;
};

// One call: inputs [ranks][in_elements] from the host, outputs poisoned
// (all bits set: NaN, or -1 for the integers) before it and copied to `outputs`
// [ranks][out_elements]. Returns each rank's error ("" if none).
std::vector<std::string> HarnessRun(const HarnessCase& c, const void* inputs, void* outputs);

// `steps` calls queued as JAX queues executions: each rank's thread enqueues
// every step on its stream without waiting for any (each step a new XLA run
// id and buffers of its own), then synchronises once. Inputs
// [steps][ranks][in_elements] from the host, outputs poisoned before and
// copied to `outputs` [steps][ranks][out_elements]. Returns each rank's
// first error ("" if none).
std::vector<std::string> HarnessQueue(const HarnessCase& c, int64_t steps, const void* inputs,
                                      void* outputs);

struct HarnessTimes {
  std::vector<double> device_us;  // per call: first start to last end over the ranks' streams
  double host_us_per_call;        // wall time of all calls / calls, rank threads kept alive
  int64_t lanes;                  // device engine: blocks per rank kernel
  bool one_shot;
};

// `calls` timed calls after `warmup`, cycling through `rotate` buffer sets per
// rank so caches do not flatter repeated calls.
HarnessTimes HarnessTime(const HarnessCase& c, int calls, int warmup, int rotate);

// The same k threads, streams and events as HarnessTime, each call an empty
// kernel: what launching from k threads onto one GPU costs by itself, under
// every virtual-rank time (docs/PERFORMANCE.md).
HarnessTimes HarnessLaunchFloor(int64_t ranks, int calls, int warmup);

// Device-side microseconds of cudaMemcpyAsync of `bytes` within the GPU.
std::vector<double> HarnessCopyTimesUs(int64_t bytes, int calls);

// Device-side microseconds of dst = a + b over `elements` of `type` (an
// engine type: a RingCall's element_type) by the reduce kernel of the host-staged engine (the same 16-byte adds the device ring's
// lanes run, spread over the whole GPU).
std::vector<double> HarnessReduceTimesUs(xla::ffi::DataType type, int64_t elements, int calls);

// out[i] = a[i] (op) b[i] over `n` components of `type` (an engine type: a
// RingCall's element_type) by the CUDA engines' element rule
// (cuda_elementwise.cuh's Combine, with the accumulation type's conversions),
// run on the host: no GPU needed.
void HarnessCombineOnHost(xla::ffi::DataType type, Reduction reduction, const void* a, const void* b,
                          void* out, int64_t n);

struct HarnessDevice {
  std::string name;
  int sms;
  int compute_capability;
  int ring_blocks_per_sm;  // of the device ring's kernels for float32
  int max_lanes;
};
HarnessDevice HarnessDeviceInfo();

}  // namespace jaxring
