// The cross-process ring handlers (cpu_mpi_ring.cc, cuda_mpi_ring.cc) as their Python module sees them.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace jaxring {

inline constexpr char kMpiRingTargetName[] = "jaxring_mpi_ring";

// The communicator (an MPI_Comm handle, as mpi4py's MPI._handleof gives it)
// whose processes the leg of local device `device_ordinal` reduces over.
void SetDeviceComm(int64_t device_ordinal, uintptr_t handle);

extern "C" XLA_FFI_Error* kMpiRingCpu(XLA_FFI_CallFrame*);
// Built only with a CUDA toolkit (JAXRING_MPI_CUDA).
extern "C" XLA_FFI_Error* kMpiRingCuda(XLA_FFI_CallFrame*);

}  // namespace jaxring
