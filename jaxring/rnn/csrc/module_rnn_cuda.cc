// XLA FFI handlers of the persistent recurrent layer on CUDA, and the Python module that hands
// them to JAX (jaxring/rnn/layer.py registers them and calls them under a custom VJP).
//
// Each handler checks that its buffers have the shapes of one layer (persistent_rnn_kernels.cuh's
// layouts), zeroes what the kernels expect zero, and makes one cooperative launch on XLA's
// stream. The split (unit_groups, batch_rows) and the staged chunk come from jaxring/rnn/plan.py
// as attributes; a grid that cannot be resident at once is refused by the launch, so a wrong plan
// fails the call, never hangs it.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "persistent_rnn.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace jaxring::rnn {
namespace {

constexpr char kForwardTarget[] = "jaxring_persistent_rnn_forward";
constexpr char kBackwardTarget[] = "jaxring_persistent_rnn_backward";

std::string Dims(ffi::Span<const int64_t> dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// "" when `buffer` has `want` dimensions, else what was wrong and where.
template <typename Buffer>
std::string CheckDims(const char* target, const char* name, const Buffer& buffer,
                      std::initializer_list<int64_t> want) {
  ffi::Span<const int64_t> got = buffer.dimensions();
  bool same = got.size() == want.size();
  for (size_t i = 0; same && i < got.size(); ++i) same = got[i] == want.begin()[i];
  if (same) return "";
  return std::string(target) + ": " + name + " has shape " + Dims(got) + " but the layer needs " +
         Dims(ffi::Span<const int64_t>(want.begin(), want.size())) +
         " (layouts in jaxring/rnn/csrc/persistent_rnn_kernels.cuh); call it through jaxring/rnn/layer.py";
}

// The layer's shape from kernels [D, H, G * H] and an activation [D, B, T, ...], or an error.
// `chunk` is the pass's staged columns (plan.py's forward_chunk or backward_chunk), checked by
// the caller, which knows the product's depth.
std::string DescribeLayer(const char* target, const ffi::AnyBuffer& kernels, const ffi::AnyBuffer& activation,
                          int64_t unit_groups, int64_t batch_rows, float relu_clip, Shape* shape) {
  ffi::Span<const int64_t> k = kernels.dimensions(), a = activation.dimensions();
  if (k.size() != 3 || a.size() != 4 || k[1] < 1 || k[2] % k[1] != 0 || (k[2] / k[1] != 1 && k[2] / k[1] != 3))
    return std::string(target) + ": kernels " + Dims(k) + " are not [directions, hidden, gates * hidden] with 1 or "
           "3 gates, or the activations " + Dims(a) + " are not [directions, batch, frames, ...]";
  if (unit_groups < 1 || unit_groups > k[1])
    return std::string(target) + ": unit_groups is " + std::to_string(unit_groups) +
           ", it must be between 1 and the hidden size " + std::to_string(k[1]) + " (jaxring/rnn/plan.py)";
  if (batch_rows < 1 || batch_rows > a[1])
    return std::string(target) + ": batch_rows is " + std::to_string(batch_rows) +
           ", it must be between 1 and the batch " + std::to_string(a[1]) + " (jaxring/rnn/plan.py)";
  *shape = Shape{int(k[0]), int(a[1]), int(a[2]), int(k[1]), int(k[2] / k[1]), int(unit_groups), int(batch_rows),
                 relu_clip, 0, 0};
  return "";
}

// "" when `chunk` columns of a product `depth` deep can be staged at once: a positive multiple of
// the tile no larger than the depth padded to it.
std::string CheckChunk(const char* target, int64_t chunk, int64_t depth) {
  if (chunk >= kTile && chunk % kTile == 0 && chunk <= RoundUpToTile(int(depth))) return "";
  return std::string(target) + ": chunk is " + std::to_string(chunk) + ", it must be a multiple of " +
         std::to_string(kTile) + " between " + std::to_string(kTile) + " and " +
         std::to_string(RoundUpToTile(int(depth))) +
         " (jaxring/rnn/plan.py's forward_chunk or backward_chunk)";
}

// The storage type of `buffer`, which must also be every other compute-dtype buffer's.
bool StorageOf(ffi::DataType type, Storage* storage) {
  if (type == ffi::DataType::F32) return *storage = Storage::kFloat32, true;
  if (type == ffi::DataType::BF16) return *storage = Storage::kBfloat16, true;
  return false;
}

ffi::Error Refuse(const std::string& why) { return ffi::Error::InvalidArgument(why); }

ffi::Error LaunchError(const char* target, const Shape& s, int32_t device, cudaError_t error) {
  std::string why = std::string(target) + " on device " + std::to_string(device) + ": " + cudaGetErrorString(error);
  if (error == cudaErrorCooperativeLaunchTooLarge)
    why += " (" + std::to_string(s.directions * BlocksPerDirection(s)) + " blocks cannot all be resident at "
           "once: jaxring/rnn/plan.py's budget does not match this device; set model.rnn_impl=scan)";
  return ffi::Error::Internal(why);
}

ffi::Error Forward(cudaStream_t stream, int32_t device, ffi::AnyBuffer kernels, ffi::AnyBuffer biases,
                   ffi::AnyBuffer projected, ffi::Buffer<ffi::PRED> mask, ffi::Result<ffi::AnyBuffer> outputs,
                   ffi::Result<ffi::AnyBuffer> states, ffi::Result<ffi::Buffer<ffi::F32>> saved,
                   int64_t unit_groups, int64_t batch_rows, int64_t chunk, float relu_clip) {
  Shape s;
  Storage storage;
  std::string why = DescribeLayer(kForwardTarget, kernels, projected, unit_groups, batch_rows, relu_clip, &s);
  if (!why.empty()) return Refuse(why);
  why = CheckChunk(kForwardTarget, chunk, s.hidden);
  if (!why.empty()) return Refuse(why);
  s.forward_chunk = int(chunk);
  if (!StorageOf(kernels.element_type(), &storage))
    return Refuse(std::string(kForwardTarget) + ": the compute dtype must be float32 or bfloat16");
  const int64_t D = s.directions, B = s.batch, T = s.frames, H = s.hidden, W = s.gates * s.hidden;
  for (const std::string& mismatch : {
           CheckDims(kForwardTarget, "biases", biases, {D, W}),
           CheckDims(kForwardTarget, "projected", projected, {D, B, T, W}),
           CheckDims(kForwardTarget, "mask", mask, {D, B, T}),
           CheckDims(kForwardTarget, "outputs", *outputs, {D, B, T, H}),
           CheckDims(kForwardTarget, "states", *states, {D, T + 1, B, H}),
           CheckDims(kForwardTarget, "saved", *saved, {D, T, B, SavedWidth(s)})})
    if (!mismatch.empty()) return Refuse(mismatch);
  for (const ffi::AnyBuffer* same : {&biases, &projected, &*outputs, &*states})
    if (same->element_type() != kernels.element_type())
      return Refuse(std::string(kForwardTarget) + ": kernels, biases, projected, outputs and states must share "
                    "one dtype");
  cudaError_t error = cudaSetDevice(device);
  // Each direction's state before its first frame is zero; the kernel writes the other slots.
  const size_t slot = size_t(B) * H * StorageBytes(storage);
  for (int64_t d = 0; d < D && error == cudaSuccess; ++d)
    error = cudaMemsetAsync(static_cast<char*>(states->untyped_data()) + d * (T + 1) * slot, 0, slot, stream);
  if (error == cudaSuccess)
    error = LaunchForward(stream, s, storage, kernels.untyped_data(), biases.untyped_data(),
                          projected.untyped_data(), mask.typed_data(), outputs->untyped_data(),
                          states->untyped_data(), saved->typed_data());
  return error == cudaSuccess ? ffi::Error::Success() : LaunchError(kForwardTarget, s, device, error);
}

ffi::Error Backward(cudaStream_t stream, int32_t device, ffi::AnyBuffer kernels, ffi::Buffer<ffi::PRED> mask,
                    ffi::AnyBuffer states, ffi::Buffer<ffi::F32> saved, ffi::AnyBuffer d_outputs,
                    ffi::Result<ffi::AnyBuffer> d_recurrent, ffi::Result<ffi::AnyBuffer> d_projected,
                    int64_t unit_groups, int64_t batch_rows, int64_t chunk, float relu_clip) {
  Shape s;
  Storage storage;
  std::string why = DescribeLayer(kBackwardTarget, kernels, d_outputs, unit_groups, batch_rows, relu_clip, &s);
  if (!why.empty()) return Refuse(why);
  why = CheckChunk(kBackwardTarget, chunk, int64_t(s.gates) * s.hidden);
  if (!why.empty()) return Refuse(why);
  s.backward_chunk = int(chunk);
  if (!StorageOf(kernels.element_type(), &storage))
    return Refuse(std::string(kBackwardTarget) + ": the compute dtype must be float32 or bfloat16");
  const int64_t D = s.directions, B = s.batch, T = s.frames, H = s.hidden, W = s.gates * s.hidden;
  for (const std::string& mismatch : {
           CheckDims(kBackwardTarget, "mask", mask, {D, B, T}),
           CheckDims(kBackwardTarget, "states", states, {D, T + 1, B, H}),
           CheckDims(kBackwardTarget, "saved", saved, {D, T, B, SavedWidth(s)}),
           CheckDims(kBackwardTarget, "d_outputs", d_outputs, {D, B, T, H}),
           CheckDims(kBackwardTarget, "d_recurrent", *d_recurrent, {D, T, B, W}),
           CheckDims(kBackwardTarget, "d_projected", *d_projected, {D, B, T, W})})
    if (!mismatch.empty()) return Refuse(mismatch);
  for (const ffi::AnyBuffer* same : {&states, &d_outputs, &*d_recurrent, &*d_projected})
    if (same->element_type() != kernels.element_type())
      return Refuse(std::string(kBackwardTarget) + ": kernels, states, d_outputs, d_recurrent and d_projected must "
                    "share one dtype");
  // The kernel writes every element of both results: nothing to zero.
  cudaError_t error = cudaSetDevice(device);
  if (error == cudaSuccess)
    error = LaunchBackward(stream, s, storage, kernels.untyped_data(), mask.typed_data(), states.untyped_data(),
                           saved.typed_data(), d_outputs.untyped_data(), d_recurrent->untyped_data(),
                           d_projected->untyped_data());
  return error == cudaSuccess ? ffi::Error::Success() : LaunchError(kBackwardTarget, s, device, error);
}

}  // namespace

// No command-buffer trait: cudaFuncSetAttribute runs on the host at every call.
XLA_FFI_DEFINE_HANDLER_SYMBOL(kPersistentForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()          // kernels [D, H, W]
                                  .Arg<ffi::AnyBuffer>()          // biases [D, W]
                                  .Arg<ffi::AnyBuffer>()          // projected [D, B, T, W]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask [D, B, T]
                                  .Ret<ffi::AnyBuffer>()          // outputs [D, B, T, H]
                                  .Ret<ffi::AnyBuffer>()          // states [D, T + 1, B, H]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // saved [D, T, B, S]
                                  .Attr<int64_t>("unit_groups")
                                  .Attr<int64_t>("batch_rows")
                                  .Attr<int64_t>("chunk")         // plan.py's forward_chunk
                                  .Attr<float>("relu_clip"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kPersistentBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()          // kernels [D, H, W]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask [D, B, T]
                                  .Arg<ffi::AnyBuffer>()          // states [D, T + 1, B, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // saved [D, T, B, S]
                                  .Arg<ffi::AnyBuffer>()          // d_outputs [D, B, T, H]
                                  .Ret<ffi::AnyBuffer>()          // d_recurrent [D, T, B, W]
                                  .Ret<ffi::AnyBuffer>()          // d_projected [D, B, T, W]
                                  .Attr<int64_t>("unit_groups")
                                  .Attr<int64_t>("batch_rows")
                                  .Attr<int64_t>("chunk")         // plan.py's backward_chunk
                                  .Attr<float>("relu_clip"));

}  // namespace jaxring::rnn

NB_MODULE(_jaxring_rnn_cuda, m) {
  m.attr("FORWARD_TARGET") = jaxring::rnn::kForwardTarget;
  m.attr("BACKWARD_TARGET") = jaxring::rnn::kBackwardTarget;
  m.attr("THREADS_PER_BLOCK") = jaxring::rnn::kThreadsPerBlock;
  // The kernels' shared memory per block, for the tests to hold plan.py's byte counts to.
  m.def("shared_bytes", [](int directions, int batch, int hidden, int gates, int unit_groups, int batch_rows,
                           int forward_chunk, int backward_chunk, int storage_bytes) {
    using namespace jaxring::rnn;
    if (storage_bytes != 2 && storage_bytes != 4)
      throw std::invalid_argument("shared_bytes: storage_bytes is " + std::to_string(storage_bytes) +
                                  ", the kernels store bfloat16 (2) or float32 (4)");
    Shape s{directions, batch, 1, hidden, gates, unit_groups, batch_rows, 0.f, forward_chunk, backward_chunk};
    Storage storage = storage_bytes == 2 ? Storage::kBfloat16 : Storage::kFloat32;
    return nb::make_tuple(ForwardSharedBytes(s, storage), BackwardSharedBytes(s, storage));
  }, nb::arg("directions"), nb::arg("batch"), nb::arg("hidden"), nb::arg("gates"), nb::arg("unit_groups"),
     nb::arg("batch_rows"), nb::arg("forward_chunk"), nb::arg("backward_chunk"), nb::arg("storage_bytes"));
  m.def("registrations", []() {
    nb::dict targets;
    targets[jaxring::rnn::kForwardTarget] = nb::capsule(reinterpret_cast<void*>(jaxring::rnn::kPersistentForward));
    targets[jaxring::rnn::kBackwardTarget] = nb::capsule(reinterpret_cast<void*>(jaxring::rnn::kPersistentBackward));
    return targets;
  });
  // What plan.DeviceBudget needs of a device: its SMs, the opt-in shared memory per block, and
  // whether it launches cooperative grids at all.
  m.def("device_budget", [](int ordinal) {
    int sms = 0, shared = 0, cooperative = 0;
    cudaError_t error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal);
    if (error == cudaSuccess)
      error = cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal);
    if (error == cudaSuccess) error = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, ordinal);
    if (error != cudaSuccess)
      throw std::runtime_error("jaxring persistent RNN: reading CUDA device " + std::to_string(ordinal) +
                               "'s attributes: " + cudaGetErrorString(error));
    cudaDeviceProp props;
    std::string name = cudaGetDeviceProperties(&props, ordinal) == cudaSuccess ? props.name : "CUDA device";
    nb::dict budget;
    budget["name"] = name;
    budget["sms"] = sms;
    budget["shared_bytes_per_block"] = shared;
    budget["cooperative_launch"] = cooperative != 0;
    return budget;
  }, nb::arg("ordinal"));
}
