// Python module of the virtual-rank harness (ring_harness.h), for the GPU
// checks and benchmarks in scripts/; not used by the collectives.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "core/ring_handler_common.h"
#include "testing/ring_harness.h"

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu>;

xla::ffi::DataType TypeOf(const std::string& dtype) {
  if (dtype == "float32") return xla::ffi::DataType::F32;
  if (dtype == "bfloat16") return xla::ffi::DataType::BF16;
  if (dtype == "float16") return xla::ffi::DataType::F16;
  if (dtype == "int32") return xla::ffi::DataType::S32;
  throw std::invalid_argument("dtype must be float32, bfloat16, float16 or int32, got '" + dtype + "'");
}

jaxring::HarnessCase CaseOf(const std::string& engine, const std::string& path, int64_t mode,
                            const std::string& dtype, int64_t ranks, int64_t elements,
                            int64_t slice_bytes, double timeout_s) {
  if (ranks < 1 || mode < 0 || mode > 2 || elements < 0) {
    throw std::invalid_argument("need ranks >= 1, mode 0..2 and elements >= 0");
  }
  if (mode != 0 && elements % ranks != 0) {
    throw std::invalid_argument("reduce_scatter and all_gather take a full buffer of whole chunks: "
                                "elements must be a multiple of ranks");
  }
  return jaxring::HarnessCase{engine, path, mode, TypeOf(dtype), ranks, elements, slice_bytes,
                              timeout_s};
}

}  // namespace

NB_MODULE(_jaxring_cuda_harness, m) {
  m.def(
      "run",
      [](const std::string& engine, const std::string& path, int64_t mode, const std::string& dtype,
         Array inputs, Array outputs, int64_t elements, int64_t slice_bytes, double timeout_s) {
        const auto c = CaseOf(engine, path, mode, dtype, inputs.shape(0), elements, slice_bytes,
                              timeout_s);
        const size_t bytes = jaxring::ElementBytes(c.type);
        if (inputs.itemsize() != bytes || outputs.itemsize() != bytes ||
            outputs.shape(0) != inputs.shape(0)) {
          throw std::invalid_argument("inputs and outputs must be [ranks, n] arrays of the dtype's item size");
        }
        nb::gil_scoped_release release;
        return jaxring::HarnessRun(c, inputs.data(), outputs.data());
      },
      nb::arg("engine"), nb::arg("path"), nb::arg("mode"), nb::arg("dtype"), nb::arg("inputs"),
      nb::arg("outputs"), nb::arg("elements"), nb::arg("slice_bytes"), nb::arg("timeout_s"),
      "One call of k = len(inputs) virtual ranks; fills `outputs`; returns each rank's error.");
  m.def(
      "queue",
      [](const std::string& engine, const std::string& path, int64_t mode, const std::string& dtype,
         Array inputs, Array outputs, int64_t elements, int64_t slice_bytes, double timeout_s) {
        if (inputs.ndim() != 3 || outputs.ndim() != 3 || outputs.shape(0) != inputs.shape(0) ||
            outputs.shape(1) != inputs.shape(1)) {
          throw std::invalid_argument("inputs and outputs must be [steps, ranks, n] arrays");
        }
        const auto c = CaseOf(engine, path, mode, dtype, inputs.shape(1), elements, slice_bytes,
                              timeout_s);
        const size_t bytes = jaxring::ElementBytes(c.type);
        const int64_t chunk = elements / c.ranks;
        if (inputs.itemsize() != bytes || outputs.itemsize() != bytes ||
            static_cast<int64_t>(inputs.shape(2)) != (mode == 2 ? chunk : elements) ||
            static_cast<int64_t>(outputs.shape(2)) != (mode == 1 ? chunk : elements)) {
          throw std::invalid_argument(
              "inputs and outputs must have the dtype's item size, and n the elements each rank "
              "gives and gets (all_gather gives a chunk, reduce_scatter gets one)");
        }
        const int64_t steps = inputs.shape(0);
        nb::gil_scoped_release release;
        return jaxring::HarnessQueue(c, steps, inputs.data(), outputs.data());
      },
      nb::arg("engine"), nb::arg("path"), nb::arg("mode"), nb::arg("dtype"), nb::arg("inputs"),
      nb::arg("outputs"), nb::arg("elements"), nb::arg("slice_bytes"), nb::arg("timeout_s"),
      "len(inputs) steps of k = inputs.shape[1] virtual ranks, queued without a sync between them; "
      "fills `outputs`; returns each rank's first error.");
  m.def(
      "time",
      [](const std::string& engine, const std::string& path, int64_t mode, const std::string& dtype,
         int64_t ranks, int64_t elements, int64_t slice_bytes, int calls, int warmup, int rotate) {
        const auto c = CaseOf(engine, path, mode, dtype, ranks, elements, slice_bytes, 60.0);
        jaxring::HarnessTimes t;
        {
          nb::gil_scoped_release release;
          t = jaxring::HarnessTime(c, calls, warmup, rotate);
        }
        nb::dict out;
        out["device_us"] = t.device_us;
        out["host_us_per_call"] = t.host_us_per_call;
        out["lanes"] = t.lanes;
        out["one_shot"] = t.one_shot;
        return out;
      },
      nb::arg("engine"), nb::arg("path"), nb::arg("mode"), nb::arg("dtype"), nb::arg("ranks"),
      nb::arg("elements"), nb::arg("slice_bytes"), nb::arg("calls"), nb::arg("warmup"),
      nb::arg("rotate"));
  m.def(
      "launch_floor",
      [](int64_t ranks, int calls, int warmup) {
        jaxring::HarnessTimes t;
        {
          nb::gil_scoped_release release;
          t = jaxring::HarnessLaunchFloor(ranks, calls, warmup);
        }
        nb::dict out;
        out["device_us"] = t.device_us;
        out["host_us_per_call"] = t.host_us_per_call;
        return out;
      },
      nb::arg("ranks"), nb::arg("calls"), nb::arg("warmup"),
      "An empty kernel per call from each of `ranks` threads, timed as `time` times a collective.");
  m.def("copy_times_us", &jaxring::HarnessCopyTimesUs, nb::arg("bytes"), nb::arg("calls"));
  m.def(
      "reduce_times_us",
      [](const std::string& dtype, int64_t elements, int calls) {
        return jaxring::HarnessReduceTimesUs(TypeOf(dtype), elements, calls);
      },
      nb::arg("dtype"), nb::arg("elements"), nb::arg("calls"));
  m.def("device_info", [] {
    const auto d = jaxring::HarnessDeviceInfo();
    nb::dict out;
    out["name"] = d.name;
    out["sms"] = d.sms;
    out["compute_capability"] = d.compute_capability;
    out["ring_blocks_per_sm"] = d.ring_blocks_per_sm;
    out["max_lanes"] = d.max_lanes;
    return out;
  });
}
