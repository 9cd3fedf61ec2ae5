// Python module of the CUDA handlers: their FFI capsules and the runtime knobs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "core/ring_handler_common.h"
#include "core/timeout.h"
#include "cuda/engine_choice.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

namespace jaxring {
extern "C" XLA_FFI_Error* kRingCuda(XLA_FFI_CallFrame*);
}

NB_MODULE(_jaxring_cuda, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets[jaxring::kTargetName] = nb::capsule(reinterpret_cast<void*>(jaxring::kRingCuda));
    return targets;
  });
  m.def("engine_choice_error", &jaxring::EngineChoiceError);
  m.def("default_timeout_s", &jaxring::DefaultTimeoutSeconds);
  m.def("set_default_timeout_s", &jaxring::SetDefaultTimeoutSeconds, nb::arg("seconds"));
}
