// The cross-process ring handlers (cpu_mpi_ring.cc, cuda_mpi_ring.cc) as their Python module sees them.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace jaxring {

inline constexpr char kMpiRingTargetName[] = "jaxring_mpi_ring";

extern "C" XLA_FFI_Error* kMpiRingCpu(XLA_FFI_CallFrame*);

// How long a CPU leg may wait for the other processes, at a time, on XLA's
// thread before a task thread takes it over (cpu_mpi_ring.cc); settable for
// tests and benchmarks.
inline constexpr int64_t kDefaultLegPatienceUs = 50;
void SetLegPatienceUs(int64_t us);

// How many of this process' CPU legs finished on XLA's thread, and how many a
// task thread took over because another process kept them waiting
// (cpu_mpi_ring.cc).
struct LegThreads {
  int64_t finished_on_xla_thread;
  int64_t handed_off;
};
LegThreads CpuLegThreads();

// How long every wait of a leg polls MPI alone before it starts yielding the
// core between polls (mpi_host_ring.cc's PollUntil): a small message from a
// process that is running arrives within microseconds, and a sched_yield per
// poll cost the scalar reductions of a conjugate-gradient loop more than
// MPI_Allreduce's own wait does (docs/PERFORMANCE.md, "Small messages, in
// plain jit"); settable for benchmarks.
inline constexpr int64_t kDefaultLegSpinUs = 20;
void SetLegSpinUs(int64_t us);
// Built only with a CUDA toolkit (JAXRING_MPI_CUDA).
extern "C" XLA_FFI_Error* kMpiRingCuda(XLA_FFI_CallFrame*);

}  // namespace jaxring
