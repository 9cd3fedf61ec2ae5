// What the CPU and CUDA handlers share beyond the schedule: the attributes
// the Python side passes, and how a handler finds its rank from them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/call_key.h"
#include "core/ring_schedule.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// The FFI target both handlers register under; Python reads it from the
// compiled module (jaxring/collectives/_ffi.py).
inline constexpr char kTargetName[] = "jaxring_ring";

struct RingCall {
  CallKey key;
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
inline RingCall MakeRingCall(CallKey key, Mode mode, int64_t elements, int64_t ranks,
                             int64_t rank, int64_t timeout_ms, int64_t slice_bytes,
                             xla::ffi::DataType type) {
  return RingCall{key,
                  mode,
                  elements,
                  ranks,
                  rank,
                  timeout_ms,
                  std::max<int64_t>(1, slice_bytes / ElementBytes(type)),
                  // A chunk that is the caller's block (reduce_scatter's output, all_gather's
                  // input) is one of N equal ones the caller padded: unaligned.
                  TraitsOf(mode).input_is_chunk() || TraitsOf(mode).output_is_chunk()
                      ? 1
                      : 16 / ElementBytes(type)};
}

// The workspace XLA allocates next to a call's output, in 4-byte elements of
// the accumulation type: [partial sums | staging slice]. The one definition:
// jaxring/collectives/_ring_call.py sizes the buffer with it (through
// _jaxring_cpu.workspace_elements) and the handlers check what they get.
// Partial sums: all-reduce keeps them in the output when it has the
// accumulation type (4-byte types); reduce_scatter's output is one chunk, so
// it needs a full buffer; all_gather sums nothing. The staging slice (CUDA
// only) receives a peer's operand where peer access cannot be enabled.
struct WorkspaceLayout {
  int64_t partial_sums;
  int64_t staging;
  int64_t total() const { return partial_sums + staging; }
};

inline WorkspaceLayout WorkspaceFor(Mode mode, int64_t element_bytes, int64_t elements,
                                    int64_t slice_bytes, bool staging_slice) {
  const ModeTraits traits = TraitsOf(mode);
  const bool sums_in_output =
      !traits.reduces || (!traits.output_is_chunk() && element_bytes == 4);
  return WorkspaceLayout{sums_in_output ? 0 : elements,
                         staging_slice ? std::max<int64_t>(1, slice_bytes / element_bytes) : 0};
}

inline WorkspaceLayout WorkspaceFor(const RingCall& call, xla::ffi::DataType type,
                                    bool staging_slice) {
  const int64_t bytes = ElementBytes(type);
  return WorkspaceFor(call.mode, bytes, call.elements, call.slice_elements * bytes, staging_slice);
}

// "" when the workspace XLA gave the handler has the layout's size, else why not.
inline std::string CheckWorkspace(const WorkspaceLayout& layout, int64_t given_elements) {
  if (given_elements == layout.total()) return "";
  return "jaxring: the workspace has " + std::to_string(given_elements) +
         " elements but this call needs " + std::to_string(layout.total()) + " (partial sums " +
         std::to_string(layout.partial_sums) + " + staging " + std::to_string(layout.staging) +
         "); the lowering (jaxring/collectives/_ring_call.py) and the compiled handler disagree: "
         "rebuild the package (pip install --no-build-isolation -e .)";
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
  if (TraitsOf(static_cast<Mode>(mode)).name == nullptr) {
    return "jaxring: unknown collective mode " + std::to_string(mode);
  }
  if (ring_size < 1 || ring_devices.size() % ring_size != 0) {
    return "jaxring: ring_devices is not a whole number of rings";
  }
  for (size_t i = 0; i < ring_devices.size(); ++i) {
    if (ring_devices[i] == device_ordinal) {
      const int64_t index = static_cast<int64_t>(i);
      *call = MakeRingCall(CallKey{run_id, op_id, index / ring_size},
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
