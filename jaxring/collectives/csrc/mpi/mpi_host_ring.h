// The cross-process ring over host buffers (mpi_host_ring.cc): the one
// implementation that the CPU handler (cpu_mpi_ring.cc) runs on XLA's buffers
// and the CUDA handler (cuda_mpi_ring.cc) runs on pinned host copies of them.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/timeout.h"
#include "mpi/leg_plan.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// One call of a leg: its plan (leg_plan.h; plans are never freed), this
// local device's communicator with its rank and size, and the deadline.
struct Leg {
  const LegPlan* plan;
  MPI_Comm comm;
  int rank;
  int size;
  int64_t device;
  Clock::time_point deadline;
};

// The leg of local device `device_ordinal` by the plan with id `plan_id`, on
// buffers of `type`, or an InvalidArgument error when there is no such plan,
// that device has no clone of its communicator, or `type` is not the plan's.
xla::ffi::Error OpenLeg(int64_t plan_id, int32_t device_ordinal, xla::ffi::DataType type, Leg* leg);

// A leg in flight. StartLeg posts its first messages; `in` and `out` must
// outlive it.
class LegInFlight {
 public:
  virtual ~LegInFlight() = default;
  // Carries the leg on until it is done or one wait for the other processes
  // lasts longer than `patience`: false in the latter case (before the leg's
  // deadline), and Finish may be called again, on any thread; true when done,
  // with *error "" or the message naming the process that did not answer by
  // the deadline.
  virtual bool Finish(Clock::duration patience, std::string* error) = 0;
};

// Reduces the `elements` values of the leg's type at `in` over the leg's processes into
// `out` (host memory; `out` may be `in` for the ring, not for one-shot).
std::unique_ptr<LegInFlight> StartLeg(const void* in, void* out, int64_t elements, Leg leg);

// StartLeg's leg, waited for until done or the leg's deadline: "" or the
// message naming the process that did not answer.
std::string RunHostRing(const void* in, void* out, int64_t elements, Leg leg);

}  // namespace jaxring
