// What the CPU and CUDA handlers share beyond the schedule: the attributes
// the Python side passes, and how a handler finds its rank from them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/call_key.h"
#include "core/reduction.h"
#include "core/ring_schedule.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// The FFI target both handlers register under; Python reads it from the
// compiled module (jaxring/collectives/_ffi.py).
inline constexpr char kTargetName[] = "jaxring_ring";

// Every element type the ring takes, and what the engines compute on: the one
// mapping (Python reads it from the compiled module, ELEMENT_TYPES). A complex
// number is two components, added one by one; a bool is a byte of 0 or 1
// (only max and min reduce it: allreduce.py sums bools as int32, as lax.psum does).
struct ElementType {
  const char* name;                 // numpy's name: Python's key
  xla::ffi::DataType type;          // the buffer's type as XLA hands it over
  xla::ffi::DataType component;     // what the engines compute on
  xla::ffi::DataType accumulation;  // what the reductions of components accumulate in
};

inline constexpr ElementType kElementTypes[] = {
    {"float32", xla::ffi::DataType::F32, xla::ffi::DataType::F32, xla::ffi::DataType::F32},
    {"bfloat16", xla::ffi::DataType::BF16, xla::ffi::DataType::BF16, xla::ffi::DataType::F32},
    {"float16", xla::ffi::DataType::F16, xla::ffi::DataType::F16, xla::ffi::DataType::F32},
    {"float64", xla::ffi::DataType::F64, xla::ffi::DataType::F64, xla::ffi::DataType::F64},
    {"complex64", xla::ffi::DataType::C64, xla::ffi::DataType::F32, xla::ffi::DataType::F32},
    {"complex128", xla::ffi::DataType::C128, xla::ffi::DataType::F64, xla::ffi::DataType::F64},
    {"int8", xla::ffi::DataType::S8, xla::ffi::DataType::S8, xla::ffi::DataType::S8},
    {"int16", xla::ffi::DataType::S16, xla::ffi::DataType::S16, xla::ffi::DataType::S16},
    {"int32", xla::ffi::DataType::S32, xla::ffi::DataType::S32, xla::ffi::DataType::S32},
    {"int64", xla::ffi::DataType::S64, xla::ffi::DataType::S64, xla::ffi::DataType::S64},
    {"uint8", xla::ffi::DataType::U8, xla::ffi::DataType::U8, xla::ffi::DataType::U8},
    {"uint16", xla::ffi::DataType::U16, xla::ffi::DataType::U16, xla::ffi::DataType::U16},
    {"uint32", xla::ffi::DataType::U32, xla::ffi::DataType::U32, xla::ffi::DataType::U32},
    {"uint64", xla::ffi::DataType::U64, xla::ffi::DataType::U64, xla::ffi::DataType::U64},
    {"bool", xla::ffi::DataType::PRED, xla::ffi::DataType::U8, xla::ffi::DataType::U8},
};

// The row of a buffer's type, or null for a type the ring does not take.
inline const ElementType* FindElementType(xla::ffi::DataType type) {
  for (const ElementType& row : kElementTypes) {
    if (row.type == type) return &row;
  }
  return nullptr;
}
inline const ElementType* FindElementType(std::string_view name) {
  for (const ElementType& row : kElementTypes) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

// Components of the engines' type in one element of `type` (2 for a complex
// number); 0 for a type the ring does not take.
inline int64_t ComponentsPerElement(xla::ffi::DataType type) {
  const ElementType* row = FindElementType(type);
  return row == nullptr ? 0 : xla::ffi::ByteWidth(row->type) / xla::ffi::ByteWidth(row->component);
}

// Bytes of what the engines compute on (RingCall::element_type) for a buffer
// of `type`; 0 for a type the ring does not take.
inline int64_t ElementBytes(xla::ffi::DataType type) {
  const ElementType* row = FindElementType(type);
  return row == nullptr ? 0 : xla::ffi::ByteWidth(row->component);
}

inline std::string ElementTypeNames() {
  std::string names;
  for (const ElementType& row : kElementTypes) names += std::string(names.empty() ? "" : ", ") + row.name;
  return names;
}

// One call as the engines see it: elements and types are the engines'
// components (RingCall::element_type), so a complex64 buffer of n elements is
// one of 2n float32.
struct RingCall {
  CallKey key;
  Mode mode;
  int64_t elements;  // of the full (all-reduced) buffer
  int64_t ranks;
  int64_t rank;
  int64_t timeout_ms;
  int64_t slice_elements;
  int64_t align;  // chunk alignment in elements (see Chunking)
  Reduction reduction;
  xla::ffi::DataType element_type;  // the component type of the buffer's (kElementTypes)
};

// A call's description from its attributes; `rank` is its ring position,
// `elements` and `type` the buffer's (MakeRingCall turns them into components).
inline RingCall MakeRingCall(CallKey key, Mode mode, int64_t elements, int64_t ranks,
                             int64_t rank, int64_t timeout_ms, int64_t slice_bytes,
                             xla::ffi::DataType type, Reduction reduction = Reduction::kSum) {
  return RingCall{key,
                  mode,
                  elements * ComponentsPerElement(type),
                  ranks,
                  rank,
                  timeout_ms,
                  std::max<int64_t>(1, slice_bytes / ElementBytes(type)),
                  // A chunk that is the caller's block (reduce_scatter's output, all_gather's
                  // input) is one of N equal ones the caller padded: unaligned.
                  TraitsOf(mode).input_is_chunk() || TraitsOf(mode).output_is_chunk()
                      ? 1
                      : 16 / ElementBytes(type),
                  reduction,
                  FindElementType(type)->component};
}

// The workspace XLA allocates next to a call's output, in elements of the
// accumulation type (kElementTypes): [partial sums | staging slice]. The one
// definition: jaxring/collectives/_ring_call.py sizes the buffer with it
// (through _jaxring_cpu.workspace) and the handlers check what they get.
// Partial sums: all-reduce keeps them in the output when the accumulation
// type is the component type (every type but bfloat16 and float16);
// reduce_scatter's output is one chunk, so it needs a full buffer; all_gather
// reduces nothing. The staging slice (CUDA only) receives a peer's operand
// where peer access cannot be enabled.
struct WorkspaceLayout {
  int64_t partial_sums;
  int64_t staging;
  int64_t element_bytes;  // of the accumulation type
  int64_t total() const { return partial_sums + staging; }
  int64_t staging_offset_bytes() const { return partial_sums * element_bytes; }
};

// The layout of a call on `components` of `row`'s component type.
inline WorkspaceLayout WorkspaceOfComponents(Mode mode, const ElementType& row, int64_t components,
                                             int64_t slice_bytes, bool staging_slice) {
  const ModeTraits traits = TraitsOf(mode);
  const bool sums_in_output =
      !traits.reduces || (!traits.output_is_chunk() && row.accumulation == row.component);
  const int64_t component_bytes = xla::ffi::ByteWidth(row.component);
  return WorkspaceLayout{sums_in_output ? 0 : components,
                         staging_slice ? std::max<int64_t>(1, slice_bytes / component_bytes) : 0,
                         static_cast<int64_t>(xla::ffi::ByteWidth(row.accumulation))};
}

// The layout of a call on `elements` of `type` (a type of kElementTypes).
inline WorkspaceLayout WorkspaceFor(Mode mode, xla::ffi::DataType type, int64_t elements,
                                    int64_t slice_bytes, bool staging_slice) {
  return WorkspaceOfComponents(mode, *FindElementType(type), elements * ComponentsPerElement(type),
                               slice_bytes, staging_slice);
}

// `type`: the buffer's, which DescribeCall took.
inline WorkspaceLayout WorkspaceFor(const RingCall& call, xla::ffi::DataType type,
                                    bool staging_slice) {
  return WorkspaceOfComponents(call.mode, *FindElementType(type), call.elements,
                               call.slice_elements * ElementBytes(type), staging_slice);
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

// Why a call of `reduction` on elements of `row` (null: a type the ring does
// not take) cannot run, or "". The Python ops (arguments.py) refuse all of these first.
inline std::string RefuseTypeOrReduction(const ElementType* row, int64_t reduction, Mode mode) {
  if (row == nullptr) {
    return "jaxring: unsupported dtype; the ring takes " + ElementTypeNames() +
           " (jaxring/collectives/arguments.py refuses the others before they get here)";
  }
  if (ReductionName(reduction) == nullptr) {
    return "jaxring: unknown reduction " + std::to_string(reduction) + " (core/reduction.h)";
  }
  if (!TraitsOf(mode).reduces) return "";
  const bool sum = reduction == static_cast<int64_t>(Reduction::kSum);
  if (!sum && ComponentsPerElement(row->type) > 1) {
    return std::string("jaxring: ") + ReductionName(reduction) + " of " + row->name +
           ": complex numbers have no order (lax.pmax and lax.pmin refuse them too)";
  }
  if (sum && row->type == xla::ffi::DataType::PRED) {
    return "jaxring: a sum of bool; sum them as int32, as jaxring/collectives/allreduce.py and lax.psum do";
  }
  return "";
}

// `ring_devices` lists, group after group, the device ordinals of each ring in
// axis order (static, from the mesh at trace time), so the rank is the axis
// position without reading device memory. Returns an error message or "".
inline std::string DescribeCall(int64_t run_id, int32_t device_ordinal,
                                int64_t op_id, int64_t mode, int64_t elements,
                                xla::ffi::Span<const int64_t> ring_devices,
                                int64_t ring_size, int64_t timeout_ms,
                                int64_t slice_bytes, xla::ffi::DataType type,
                                int64_t reduction, RingCall* call) {
  if (TraitsOf(static_cast<Mode>(mode)).name == nullptr) {
    return "jaxring: unknown collective mode " + std::to_string(mode);
  }
  if (auto error = RefuseTypeOrReduction(FindElementType(type), reduction, static_cast<Mode>(mode));
      !error.empty()) {
    return error;
  }
  if (ring_size < 1 || ring_devices.size() % ring_size != 0) {
    return "jaxring: ring_devices is not a whole number of rings";
  }
  for (size_t i = 0; i < ring_devices.size(); ++i) {
    if (ring_devices[i] == device_ordinal) {
      const int64_t index = static_cast<int64_t>(i);
      *call = MakeRingCall(CallKey{run_id, op_id, index / ring_size},
                           static_cast<Mode>(mode), elements, ring_size, index % ring_size,
                           timeout_ms, slice_bytes, type, static_cast<Reduction>(reduction));
      return "";
    }
  }
  return "jaxring: device " + std::to_string(device_ordinal) +
         " is not in any ring of this collective";
}

}  // namespace jaxring

// The binding both platforms share after their own context: run id, device
// ordinal, input, output, workspace and the attributes, in DescribeCall's order
// (reduction last: Reduction's value).
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
      .Attr<int64_t>("slice_bytes")                   \
      .Attr<int64_t>("reduction")
