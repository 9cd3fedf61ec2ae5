// What each lowered leg of jaxring.allreduce(..., processes=...) does, fixed
// when jaxring/collectives/mpi.py lowers it, and the communicators it runs over.
//
// A leg reaches its handler as one number, the id of its plan, instead of as
// eight XLA attributes: XLA's CPU runtime decodes a custom call's attributes
// at every call, and the eight cost as much as the exchange of 8 bytes
// between two processes (docs/PERFORMANCE.md, "Small messages, in plain jit").
// Plans are never freed: a running executable may hold any id it was lowered with.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/reduction.h"
#include "core/ring_handler_common.h"
#include "core/ring_schedule.h"

namespace jaxring {

// The lowering's algorithm (mpi.py chooses it the same in every process).
enum class LegAlgorithm : int64_t { kRing = 0, kOneShot = 1, kDoubling = 2 };

// One local device's clone of a communicator (mpi.py's Communicator).
struct DeviceComm {
  MPI_Comm comm = MPI_COMM_NULL;  // MPI_COMM_NULL: no clone for this device
  int rank = 0;
  int size = 0;
};

struct LegPlan {
  int64_t comm_id;
  const ElementType* type;  // of the buffers that cross: the accumulation type or a 16-bit wire type
  Reduction reduction;
  int tag;  // the messages', the same in every process of the communicator
  int64_t timeout_ms;  // > 0 that many milliseconds, 0 the default at each call, < 0 none
  std::string what;  // the op, for messages
  LegAlgorithm algorithm;
  // The ring moves each step's chunk in pieces of at most this many elements.
  int64_t piece_elements;
  // ring_schedule.h's Mode: the all-reduce, or one of its phases alone (the ring only).
  Mode mode;
  std::vector<DeviceComm> devices;  // by device ordinal
};

// The communicator (an MPI_Comm handle, as mpi4py's MPI._handleof gives it)
// that the legs of local device `device_ordinal` over communicator `comm_id`
// run over (mpi.py numbers the communicators it was handed, each cloned once
// per local device, so the legs of two communicators, or of two devices, never
// take each other's messages). Set for every local device of a communicator
// before the first leg over it is lowered.
void SetLegComm(int64_t comm_id, int64_t device_ordinal, uintptr_t handle);

// Registers a lowered leg's plan and returns its id, or throws
// std::invalid_argument naming what the leg cannot do (a type or reduction
// the ring refuses, a phase one-shot, a communicator never set).
int64_t RegisterLegPlan(int64_t comm_id, std::string_view dtype, int64_t reduction, int64_t tag,
                        int64_t timeout_ms, std::string what, int64_t algorithm, int64_t piece_elements,
                        int64_t mode);

// The plan `id` names, or null where no plan has that id. Takes no lock: it
// runs at every call of a leg, while other threads may register plans.
const LegPlan* FindLegPlan(int64_t id);

// How many plans this process registered (ids 0 .. count - 1).
int64_t LegPlanCount();

}  // namespace jaxring
