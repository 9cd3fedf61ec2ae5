// Python module of the CPU handlers: their FFI capsules and the runtime knobs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "core/ring_handler_common.h"
#include "core/ring_schedule.h"
#include "core/timeout.h"
#include "cpu/cpu_engine.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

namespace jaxring {
extern "C" XLA_FFI_Error* kRingCpu(XLA_FFI_CallFrame*);
}

NB_MODULE(_jaxring_cpu, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets[jaxring::kTargetName] = nb::capsule(reinterpret_cast<void*>(jaxring::kRingCpu));
    return targets;
  });
  m.attr("TARGET_NAME") = jaxring::kTargetName;
  nb::dict modes;
  // Every Mode by TraitsOf's name; their values run from 0 (ring_schedule.h).
  for (int64_t mode = 0; const char* name = jaxring::TraitsOf(static_cast<jaxring::Mode>(mode)).name; ++mode) {
    modes[name] = mode;
  }
  m.attr("MODES") = modes;
  // The schedule both handlers run, for tests that check it by brute force.
  m.def("schedule", [](int64_t mode, int64_t elements, int64_t ranks, int64_t rank,
                       int64_t slice_elements, int64_t align) {
    std::vector<std::tuple<int, bool, int64_t, int64_t, int64_t, int64_t, int64_t>> stages;
    for (const auto& st : jaxring::BuildSchedule(static_cast<jaxring::Mode>(mode), elements,
                                                 ranks, rank, slice_elements, align)) {
      stages.emplace_back(static_cast<int>(st.kind), st.left_is_input, st.src, st.dst,
                          st.count, st.wait_left, st.wait_right);
    }
    return stages;
  }, "Stages of one rank: (kind, left_is_input, src, dst, count, wait_left, wait_right).");
  nb::dict reductions;
  // Every Reduction by its name; their values run from 0 (core/reduction.h).
  for (int64_t r = 0; const char* name = jaxring::ReductionName(r); ++r) reductions[name] = r;
  m.attr("REDUCTIONS") = reductions;
  nb::list element_types;
  for (const jaxring::ElementType& row : jaxring::kElementTypes) element_types.append(row.name);
  m.attr("ELEMENT_TYPES") = element_types;
  m.def("workspace", [](int64_t mode, const std::string& dtype, int64_t elements,
                        int64_t slice_bytes, bool staging_slice) {
    const jaxring::ElementType* row = jaxring::FindElementType(dtype);
    if (row == nullptr) {
      throw std::invalid_argument("workspace: the ring takes " + jaxring::ElementTypeNames() + ", not " + dtype);
    }
    const jaxring::WorkspaceLayout layout = jaxring::WorkspaceFor(
        static_cast<jaxring::Mode>(mode), row->type, elements, slice_bytes, staging_slice);
    return std::make_tuple(layout.total(), std::string(jaxring::FindElementType(row->accumulation)->name));
  }, nb::arg("mode"), nb::arg("dtype"), nb::arg("elements"), nb::arg("slice_bytes"),
     nb::arg("staging_slice"),
     "(elements, dtype name) of the workspace a call on `elements` of `dtype` needs "
     "(ring_handler_common.h's WorkspaceFor).");
  m.def("runs_in_place", [](int64_t mode, int64_t ranks) {
    return jaxring::RunsInPlace(static_cast<jaxring::Mode>(mode), ranks);
  }, nb::arg("mode"), nb::arg("ranks"),
     "Whether the CPU handler's output aliases its input for this op (cpu_engine.h's RunsInPlace).");
  // The CPU engine's path (cpu_engine.h): benchmarks force one to measure the crossover.
  nb::dict paths;
  paths["auto"] = static_cast<int64_t>(jaxring::CpuPath::kAuto);
  paths["ring"] = static_cast<int64_t>(jaxring::CpuPath::kRing);
  paths["one_shot"] = static_cast<int64_t>(jaxring::CpuPath::kOneShot);
  paths["push"] = static_cast<int64_t>(jaxring::CpuPath::kPush);
  m.attr("CPU_PATHS") = paths;
  m.def("cpu_path", [] { return static_cast<int64_t>(jaxring::CpuForcedPath()); });
  m.def("set_cpu_path", [](int64_t path) {
    if (path < 0 || path > static_cast<int64_t>(jaxring::CpuPath::kPush)) {
      throw std::invalid_argument("set_cpu_path takes a value of CPU_PATHS, got " + std::to_string(path));
    }
    jaxring::SetCpuForcedPath(static_cast<jaxring::CpuPath>(path));
  }, nb::arg("path"), "Every later call takes this path (CPU_PATHS); 'auto' chooses by size.");
  m.def("cpu_push_max_bytes", &jaxring::CpuPushMaxBytes,
        "Largest buffer (bytes) the CPU engine's 'auto' path takes the push path for (the ring above).");
  m.def("set_cpu_push_max_bytes", &jaxring::SetCpuPushMaxBytes, nb::arg("bytes"));
  m.def("default_timeout_s", &jaxring::DefaultTimeoutSeconds,
        "Seconds a meeting waits for missing ranks (inf: no limit); jaxring/collectives/timeout.py sets it.");
  m.def("set_default_timeout_s", &jaxring::SetDefaultTimeoutSeconds, nb::arg("seconds"));
}
