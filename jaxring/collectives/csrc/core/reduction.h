// How a reducing collective combines the devices' values: the one list of
// reductions (Python reads the values from the compiled module, REDUCTIONS)
// and lax's rule for each, which every engine follows.
//
//   kSum: the sum; integers wrap (two's complement, as lax.psum's), floats
//     accumulate in float32 below 32 bits (ring_handler_common.h's
//     kElementTypes), a complex number component by component.
//   kMax, kMin: lax.pmax / lax.pmin as XLA's CPU all-reduce computes them:
//     starting from -inf (max) or +inf (min), each rank's value in rank order
//     replaces the running one where it is strictly greater (smaller). So a NaN
//     is never taken (all NaN gives -inf / +inf), and of equal values (-0.0
//     and +0.0) the one of the lowest rank wins. Not for complex numbers, which
//     lax refuses.
#pragma once

#include <cstdint>

namespace jaxring {

enum class Reduction : int64_t { kSum = 0, kMax = 1, kMin = 2 };

// Python's name of each (the `op` of jaxring.allreduce); null past the last.
constexpr const char* ReductionName(int64_t reduction) {
  switch (reduction) {
    case static_cast<int64_t>(Reduction::kSum):
      return "sum";
    case static_cast<int64_t>(Reduction::kMax):
      return "max";
    case static_cast<int64_t>(Reduction::kMin):
      return "min";
    default:
      return nullptr;
  }
}

}  // namespace jaxring
