// Python module of the virtual-rank harness (ring_harness.h), for the GPU
// checks and benchmarks in scripts/gpu/; not used by the collectives.
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

const jaxring::ElementType& TypeOf(const std::string& dtype) {
  const jaxring::ElementType* row = jaxring::FindElementType(dtype);
  if (row == nullptr) {
    throw std::invalid_argument("dtype must be one of " + jaxring::ElementTypeNames() + ", got '" +
                                dtype + "'");
  }
  return *row;
}

jaxring::Reduction ReductionOf(const std::string& name) {
  for (int64_t r = 0; jaxring::ReductionName(r) != nullptr; ++r) {
    if (name == jaxring::ReductionName(r)) return static_cast<jaxring::Reduction>(r);
  }
  throw std::invalid_argument("reduction must be sum, max or min, got '" + name + "'");
}

jaxring::HarnessCase CaseOf(const std::string& engine, const std::string& path, int64_t mode,
                            const std::string& dtype, int64_t ranks, int64_t elements,
                            int64_t slice_bytes, double timeout_s,
                            const std::string& reduction = "sum") {
  if (ranks < 1 || mode < 0 || mode > 2 || elements < 0) {
    throw std::invalid_argument("need ranks >= 1, mode 0..2 and elements >= 0");
  }
  if (mode != 0 && elements % ranks != 0) {
    throw std::invalid_argument("reduce_scatter and all_gather take a full buffer of whole chunks: "
                                "elements must be a multiple of ranks");
  }
  const jaxring::ElementType& row = TypeOf(dtype);
  const jaxring::Reduction r = ReductionOf(reduction);
  // What the handler would refuse (DescribeCall), refused before any GPU work.
  if (auto why = jaxring::RefuseTypeOrReduction(&row, static_cast<int64_t>(r),
                                                static_cast<jaxring::Mode>(mode));
      !why.empty()) {
    throw std::invalid_argument(why);
  }
  return jaxring::HarnessCase{engine, path, mode, row.type, r, ranks, elements, slice_bytes, timeout_s};
}

// Arrays of any numpy type holding, per rank (and step), exactly the bytes of
// the elements the rank gives and gets: all_gather gives a chunk,
// reduce_scatter gets one. (nanobind takes numpy's own types only, so
// bfloat16 and complex128 come as bytes.)
void CheckRows(const jaxring::HarnessCase& c, const Array& inputs, const Array& outputs) {
  const size_t rank_axis = inputs.ndim() - 2;
  const int64_t chunk = c.elements / c.ranks, bytes = xla::ffi::ByteWidth(c.type);
  const auto row_bytes = [](const Array& a) { return static_cast<int64_t>(a.shape(a.ndim() - 1) * a.itemsize()); };
  if (outputs.ndim() != inputs.ndim() || outputs.shape(rank_axis) != inputs.shape(rank_axis) ||
      (rank_axis == 1 && outputs.shape(0) != inputs.shape(0)) ||
      row_bytes(inputs) != (c.mode == 2 ? chunk : c.elements) * bytes ||
      row_bytes(outputs) != (c.mode == 1 ? chunk : c.elements) * bytes) {
    throw std::invalid_argument(
        "inputs and outputs must hold, per rank, the bytes of n the elements each rank gives and gets "
        "(all_gather gives a chunk, reduce_scatter gets one) of the dtype");
  }
}

}  // namespace

NB_MODULE(_jaxring_cuda_harness, m) {
  m.def(
      "run",
      [](const std::string& engine, const std::string& path, int64_t mode, const std::string& dtype,
         Array inputs, Array outputs, int64_t elements, int64_t slice_bytes, double timeout_s,
         const std::string& reduction) {
        if (inputs.ndim() != 2 || outputs.ndim() != 2) {
          throw std::invalid_argument("inputs and outputs must be [ranks, n] arrays");
        }
        const auto c = CaseOf(engine, path, mode, dtype, inputs.shape(0), elements, slice_bytes,
                              timeout_s, reduction);
        CheckRows(c, inputs, outputs);
        nb::gil_scoped_release release;
        return jaxring::HarnessRun(c, inputs.data(), outputs.data());
      },
      nb::arg("engine"), nb::arg("path"), nb::arg("mode"), nb::arg("dtype"), nb::arg("inputs"),
      nb::arg("outputs"), nb::arg("elements"), nb::arg("slice_bytes"), nb::arg("timeout_s"),
      nb::arg("reduction") = "sum",
      "One call of k = len(inputs) virtual ranks; fills `outputs`; returns each rank's error.");
  m.def(
      "queue",
      [](const std::string& engine, const std::string& path, int64_t mode, const std::string& dtype,
         Array inputs, Array outputs, int64_t elements, int64_t slice_bytes, double timeout_s,
         const std::string& reduction) {
        if (inputs.ndim() != 3 || outputs.ndim() != 3 || outputs.shape(0) != inputs.shape(0) ||
            outputs.shape(1) != inputs.shape(1)) {
          throw std::invalid_argument("inputs and outputs must be [steps, ranks, n] arrays");
        }
        const auto c = CaseOf(engine, path, mode, dtype, inputs.shape(1), elements, slice_bytes,
                              timeout_s, reduction);
        CheckRows(c, inputs, outputs);
        const int64_t steps = inputs.shape(0);
        nb::gil_scoped_release release;
        return jaxring::HarnessQueue(c, steps, inputs.data(), outputs.data());
      },
      nb::arg("engine"), nb::arg("path"), nb::arg("mode"), nb::arg("dtype"), nb::arg("inputs"),
      nb::arg("outputs"), nb::arg("elements"), nb::arg("slice_bytes"), nb::arg("timeout_s"),
      nb::arg("reduction") = "sum",
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
        return jaxring::HarnessReduceTimesUs(TypeOf(dtype).component, elements, calls);
      },
      nb::arg("dtype"), nb::arg("elements"), nb::arg("calls"));
  m.def(
      "combine_on_host",
      [](const std::string& dtype, const std::string& reduction, Array a, Array b, Array out) {
        const jaxring::ElementType& row = TypeOf(dtype);
        const int64_t component_bytes = xla::ffi::ByteWidth(row.component);
        const int64_t bytes = static_cast<int64_t>(a.nbytes());
        if (b.nbytes() != a.nbytes() || out.nbytes() != a.nbytes() || bytes % component_bytes != 0) {
          throw std::invalid_argument("a, b and out must hold the same whole number of the dtype's components");
        }
        jaxring::HarnessCombineOnHost(row.component, ReductionOf(reduction), a.data(), b.data(), out.data(),
                                      bytes / component_bytes);
      },
      nb::arg("dtype"), nb::arg("reduction"), nb::arg("a"), nb::arg("b"), nb::arg("out"),
      "out = a (reduction) b, component by component, by the CUDA engines' element rule run on the host.");
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
