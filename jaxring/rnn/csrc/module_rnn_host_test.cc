// The persistent layer's launchers (persistent_rnn.h), compiled for the host with the shim of
// kernel_host_shim.h, on numpy arrays, for tests/jaxring/rnn/test_kernels_on_host.py. The only
// file that knows the launchers' signatures on this side: change it with them.
//
// Arrays are copied into buffers aligned as cudaMalloc aligns (256 bytes), so a tensor-core access
// faults here where it would on the GPU; buffers the kernels must write start as NaN bytes, those
// they may read (states[d][0], d_biases) as persistent_rnn.h requires them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernel_platform.cuh"
#include "persistent_rnn.h"

namespace nb = nanobind;

namespace jaxring::rnn {

void DefineShimChecks(nb::module_& module);  // host_shim_checks.cc

namespace {

using Array = nb::ndarray<nb::c_contig, nb::device::cpu>;
// (directions, batch, frames, hidden, gates, unit_groups, batch_rows, forward_chunk, backward_chunk): plan.py's.
using ShapeTuple = std::tuple<int, int, int, int, int, int, int, int, int>;

constexpr size_t kDeviceAlignment = 256;
constexpr unsigned char kUnwrittenByte = 0xff;  // NaN in float32 and bfloat16

// A device-like buffer of `bytes`, filled with `fill`, or holding `array`'s bytes.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, unsigned char fill)
      : bytes_(bytes),
        data_(static_cast<unsigned char*>(std::aligned_alloc(kDeviceAlignment, Padded(bytes))), std::free) {
    std::memset(data_.get(), fill, Padded(bytes));
  }
  DeviceBuffer(const Array& array, size_t bytes, const char* name) : DeviceBuffer(bytes, kUnwrittenByte) {
    Check(array, bytes, name);
    std::memcpy(data_.get(), array.data(), bytes);
  }
  template <typename T = void> T* get() const { return reinterpret_cast<T*>(data_.get()); }
  void CopyTo(Array& array, const char* name) const {
    Check(array, bytes_, name);
    std::memcpy(array.data(), data_.get(), bytes_);
  }

 private:
  static size_t Padded(size_t bytes) { return (bytes + kDeviceAlignment) / kDeviceAlignment * kDeviceAlignment; }
  static void Check(const Array& array, size_t bytes, const char* name) {
    if (array.nbytes() != bytes)
      throw std::invalid_argument(std::string(name) + " has " + std::to_string(array.nbytes()) +
                                  " bytes, the shape needs " + std::to_string(bytes) +
                                  ": check its shape and dtype against persistent_rnn.h's layouts");
  }
  size_t bytes_;
  std::unique_ptr<unsigned char, decltype(&std::free)> data_;
};

Storage StorageNamed(const std::string& name) {
  if (name == "float32") return Storage::kFloat32;
  if (name == "bfloat16") return Storage::kBfloat16;
  throw std::invalid_argument("storage must be float32 or bfloat16, got '" + name + "'");
}

Shape ShapeOf(const ShapeTuple& t, float relu_clip) {
  auto [directions, batch, frames, hidden, gates, unit_groups, batch_rows, forward_chunk, backward_chunk] = t;
  if (unit_groups < 1 || unit_groups > hidden)
    throw std::invalid_argument("unit_groups " + std::to_string(unit_groups) + " must be 1 to hidden (" +
                                std::to_string(hidden) + "), as jaxring/rnn/plan.py gives");
  if (batch_rows < 1 || batch_rows > batch)
    throw std::invalid_argument("batch_rows " + std::to_string(batch_rows) + " must be 1 to batch (" +
                                std::to_string(batch) + "), as jaxring/rnn/plan.py gives");
  return {directions, batch, frames, hidden, gates, unit_groups, batch_rows, relu_clip, forward_chunk, backward_chunk};
}

void Check(cudaError_t code, const char* launcher) {
  if (code != cudaSuccess)
    throw std::runtime_error(std::string(launcher) + " failed (cudaError_t " + std::to_string(int(code)) +
                             "): " + host::LastLaunchError());
}

// Writes outputs, states and saved; returns nothing (the arrays are the caller's).
void Forward(const std::string& storage_name, const ShapeTuple& shape, float relu_clip, const Array& kernels,
             const Array& biases, const Array& projected, const Array& mask, Array outputs, Array states,
             Array saved, uint64_t seed) {
  const Storage storage = StorageNamed(storage_name);
  const Shape s = ShapeOf(shape, relu_clip);
  const size_t e = StorageBytes(storage), D = s.directions, B = s.batch, T = s.frames, H = s.hidden;
  const size_t W = size_t(s.gates) * H;
  DeviceBuffer kernels_d(kernels, D * H * W * e, "kernels"), biases_d(biases, D * W * e, "biases"),
      projected_d(projected, D * B * T * W * e, "projected"), mask_d(mask, D * B * T, "mask");
  DeviceBuffer outputs_d(D * B * T * H * e, kUnwrittenByte), states_d(D * (T + 1) * B * H * e, kUnwrittenByte),
      saved_d(D * T * B * SavedWidth(s) * sizeof(float), kUnwrittenByte);
  for (size_t d = 0; d < D; ++d) std::memset(states_d.get<unsigned char>() + d * (T + 1) * B * H * e, 0, B * H * e);
  host::Options().seed = seed;
  Check(LaunchForward(nullptr, s, storage, kernels_d.get(), biases_d.get(), projected_d.get(), mask_d.get<bool>(),
                      outputs_d.get(), states_d.get(), saved_d.get<float>()),
        "LaunchForward");
  outputs_d.CopyTo(outputs, "outputs");
  states_d.CopyTo(states, "states");
  saved_d.CopyTo(saved, "saved");
}

void Backward(const std::string& storage_name, const ShapeTuple& shape, float relu_clip, const Array& kernels,
              const Array& mask, const Array& states, const Array& saved, const Array& d_outputs, Array d_recurrent,
              Array d_projected, uint64_t seed) {
  const Storage storage = StorageNamed(storage_name);
  const Shape s = ShapeOf(shape, relu_clip);
  const size_t e = StorageBytes(storage), D = s.directions, B = s.batch, T = s.frames, H = s.hidden;
  const size_t W = size_t(s.gates) * H;
  DeviceBuffer kernels_d(kernels, D * H * W * e, "kernels"), mask_d(mask, D * B * T, "mask"),
      states_d(states, D * (T + 1) * B * H * e, "states"),
      saved_d(saved, D * T * B * SavedWidth(s) * sizeof(float), "saved"),
      d_outputs_d(d_outputs, D * B * T * H * e, "d_outputs");
  DeviceBuffer d_recurrent_d(D * T * B * W * e, kUnwrittenByte), d_projected_d(D * B * T * W * e, kUnwrittenByte);
  host::Options().seed = seed;
  Check(LaunchBackward(nullptr, s, storage, kernels_d.get(), mask_d.get<bool>(), states_d.get(), saved_d.get<float>(),
                       d_outputs_d.get(), d_recurrent_d.get(), d_projected_d.get()),
        "LaunchBackward");
  d_recurrent_d.CopyTo(d_recurrent, "d_recurrent");
  d_projected_d.CopyTo(d_projected, "d_projected");
}

}  // namespace
}  // namespace jaxring::rnn

NB_MODULE(_jaxring_rnn_host_test, module) {
  using namespace jaxring::rnn;
  module.def("forward", &Forward, nb::arg("storage"), nb::arg("shape"), nb::arg("relu_clip"), nb::arg("kernels"),
             nb::arg("biases"), nb::arg("projected"), nb::arg("mask"), nb::arg("outputs"), nb::arg("states"),
             nb::arg("saved"), nb::arg("seed"),
             "LaunchForward on the host; shape is (directions, batch, frames, hidden, gates, unit_groups, batch_rows, "
             "forward_chunk, backward_chunk), "
             "arrays in persistent_rnn_kernels.cuh's layouts (bfloat16 ones as uint16 bits).");
  module.def("backward", &Backward, nb::arg("storage"), nb::arg("shape"), nb::arg("relu_clip"), nb::arg("kernels"),
             nb::arg("mask"), nb::arg("states"), nb::arg("saved"), nb::arg("d_outputs"), nb::arg("d_recurrent"),
             nb::arg("d_projected"), nb::arg("seed"),
             "LaunchBackward on the host, as forward: every frame's recurrent-input gradient and the input's.");
  DefineShimChecks(module);
}
