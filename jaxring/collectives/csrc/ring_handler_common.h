// What the CPU and CUDA handlers share beyond the schedule: the attributes
// the Python side passes, and how a handler finds its rank from them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "rendezvous.h"
#include "ring_schedule.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// The FFI target both handlers register under; Python reads it from the
// compiled module (jaxring/collectives/_ffi.py).
inline constexpr char kTargetName[] = "jaxring_ring";

struct RingCall {
  RendezvousKey key;
  Mode mode;
  int64_t elements;  // of the full (all-reduced) buffer
  int64_t ranks;
  int64_t rank;
  int64_t timeout_ms;
  int64_t slice_elements;
  int64_t align;  // chunk alignment in elements (see Chunking)
};

inline int64_t ElementBytes(xla::ffi::DataType type) {
  switch (type) {
    case xla::ffi::DataType::F32:
    case xla::ffi::DataType::S32:
      return 4;
    case xla::ffi::DataType::BF16:
    case xla::ffi::DataType::F16:
      return 2;
    default:
      return 0;
  }
}

// A call's description from its attributes; `rank` is its ring position.
inline RingCall MakeRingCall(RendezvousKey key, Mode mode, int64_t elements, int64_t ranks,
                             int64_t rank, int64_t timeout_ms, int64_t slice_bytes,
                             xla::ffi::DataType type) {
  return RingCall{key,
                  mode,
                  elements,
                  ranks,
                  rank,
                  timeout_ms,
                  std::max<int64_t>(1, slice_bytes / ElementBytes(type)),
                  mode == Mode::kAllReduce ? 16 / ElementBytes(type) : 1};
}

// `ring_devices` lists, group after group, the device ordinals of each ring in
// axis order (static, from the mesh at trace time), so the rank is the axis
// position without reading device memory. Returns an error message or "".
inline std::string DescribeCall(int64_t run_id, int32_t device_ordinal,
                                int64_t op_id, int64_t mode, int64_t elements,
                                xla::ffi::Span<const int64_t> ring_devices,
                                int64_t ring_size, int64_t timeout_ms,
                                int64_t slice_bytes, xla::ffi::DataType type,
                                RingCall* call) {
  if (ElementBytes(type) == 0) {
    return "jaxring: unsupported dtype; use float32, bfloat16, float16 or int32";
  }
  if (mode < 0 || mode > static_cast<int64_t>(Mode::kAllGather)) {
    return "jaxring: unknown collective mode";
  }
  if (ring_size < 1 || ring_devices.size() % ring_size != 0) {
    return "jaxring: ring_devices is not a whole number of rings";
  }
  for (size_t i = 0; i < ring_devices.size(); ++i) {
    if (ring_devices[i] == device_ordinal) {
      const int64_t index = static_cast<int64_t>(i);
      *call = MakeRingCall(RendezvousKey{run_id, op_id, index / ring_size},
                           static_cast<Mode>(mode), elements, ring_size, index % ring_size,
                           timeout_ms, slice_bytes, type);
      return "";
    }
  }
  return "jaxring: device " + std::to_string(device_ordinal) +
         " is not in any ring of this collective";
}

}  // namespace jaxring

// The binding both platforms share after their own context: run id, device
// ordinal, input, output, workspace and the attributes, in DescribeCall's order.
#define JAXRING_RING_BINDING(bind)                    \
  (bind)                                              \
      .Ctx<xla::ffi::RunId>()                         \
      .Ctx<xla::ffi::DeviceOrdinal>()                 \
      .Arg<xla::ffi::AnyBuffer>()                     \
      .Ret<xla::ffi::AnyBuffer>()                     \
      .Ret<xla::ffi::AnyBuffer>()                     \
      .Attr<int64_t>("op_id")                         \
      .Attr<int64_t>("mode")                          \
      .Attr<int64_t>("elements")                      \
      .Attr<xla::ffi::Span<const int64_t>>("ring_devices") \
      .Attr<int64_t>("ring_size")                     \
      .Attr<int64_t>("timeout_ms")                    \
      .Attr<int64_t>("slice_bytes")
