// The cross-process ring over host buffers (mpi_host_ring.cc): the one
// implementation that the CPU handler (cpu_mpi_ring.cc) runs on XLA's buffers
// and the CUDA handler (cuda_mpi_ring.cc) runs on pinned host copies of them.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/reduction.h"
#include "core/ring_schedule.h"
#include "core/timeout.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// One call of the leg: the communicator of its device and the limits it waits under.
struct Leg {
  MPI_Comm comm;
  int rank;
  int size;
  int tag;
  int64_t device;
  Clock::time_point deadline;
  double timeout_s;
  std::string what;
  // The algorithm, chosen by mpi.py's lowering (the same in every process):
  // one-shot (every process sends its whole buffer to every other and sums
  // all of them in rank order), recursive doubling, or the ring, moving each step's chunk in
  // pieces of at most `piece_elements`, several in flight.
  bool one_shot;
  // Recursive doubling instead of one-shot (the attribute one_shot = kDoublingAlgorithm).
  bool doubling;
  int64_t piece_elements;
  Reduction reduction;
  // ring_schedule.h's Mode: the all-reduce, or one of its phases alone (the ring, never
  // one-shot: mpi.py). The buffers hold all N chunks either way: after a reduce-scatter
  // only this rank's chunk of the output is the sum; an all-gather reads only this
  // rank's chunk of the input.
  Mode mode;
};

// The lowering's attribute one_shot: 0 the ring, 1 one-shot, kDoublingAlgorithm recursive doubling.
inline constexpr int64_t kDoublingAlgorithm = 2;

// The leg of local device `device_ordinal` over communicator `comm_id` with
// the lowering's attributes, or an InvalidArgument error when that device has
// no such communicator or the ring would refuse `type` or `reduction`
// (core/ring_handler_common.h's RefuseTypeOrReduction; the leg takes the
// 16-bit floats in float32, as mpi.py casts them).
xla::ffi::Error OpenLeg(int32_t device_ordinal, xla::ffi::DataType type, int64_t comm_id,
                        int64_t reduction, int64_t tag, int64_t timeout_ms,
                        std::string_view what, int64_t one_shot, int64_t piece_elements, int64_t mode,
                        Leg* leg);

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

// Reduces the `elements` values of `type` at `in` over the leg's processes into
// `out` (host memory; `out` may be `in` for the ring, not for one-shot). The leg
// is taken by value and moved along: a copy of Leg::what is a heap allocation,
// a measurable part of a small leg.
std::unique_ptr<LegInFlight> StartLeg(xla::ffi::DataType type, const void* in, void* out,
                                      int64_t elements, Leg leg);

// StartLeg's leg, waited for until done or the leg's deadline: "" or the
// message naming the process that did not answer.
std::string RunHostRing(xla::ffi::DataType type, const void* in, void* out, int64_t elements,
                        Leg leg);

}  // namespace jaxring

// The leg's attributes, as mpi.py's lowering passes them, after the context
// that `bind` (the handler's own) asks for: one binding for both handlers.
#define JAXRING_MPI_LEG_BINDING(bind)     \
  (bind)                                  \
      .Ctx<xla::ffi::DeviceOrdinal>()     \
      .Arg<xla::ffi::AnyBuffer>()         \
      .Ret<xla::ffi::AnyBuffer>()         \
      .Attr<int64_t>("comm")              \
      .Attr<int64_t>("reduction")         \
      .Attr<int64_t>("tag")               \
      .Attr<int64_t>("timeout_ms")        \
      .Attr<std::string_view>("what")     \
      .Attr<int64_t>("one_shot")          \
      .Attr<int64_t>("piece_elements")    \
      .Attr<int64_t>("mode")
