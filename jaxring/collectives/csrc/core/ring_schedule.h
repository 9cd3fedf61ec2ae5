// The ring schedule shared by the CPU and CUDA handlers.
//
// N ranks, buffer of S elements cut into N chunks. Chunk labels are shifted by
// one from docs/ARCHITECTURE.md ("rank r sends chunk r-s") so that after the
// reduce-scatter rank r owns chunk r, which is what reduce_scatter must return
// by axis position; the ring itself is the same.
//
//   reduce-scatter step s = 0..N-2: rank r adds chunk (r-s-2) mod N read from
//     its left neighbour (the left's input at s = 0, the left's partial sum
//     after) to its own input chunk; the last step leaves chunk r complete.
//   all-gather step s = 0..N-2: rank r copies chunk (r-s-1) mod N from its
//     left neighbour's output.
//
// Each step is cut into slices so that a rank can start on slice k of a step
// as soon as its left neighbour has finished slice k of the previous one
// (pipelining). A rank's progress is the number of stages (step x slice) it
// has finished; every wait is "neighbour's progress >= n", which the CPU
// handler (condition variable), the host-staged CUDA engine (host-side wait,
// then an event wait) and the device-synchronised one (flags polled on the
// GPU, ring_protocol.h) all express.
#pragma once

#include <cstdint>
#include <vector>

// Compiled for the device too where nvcc builds it (ring_protocol.h).
#ifdef __CUDACC__
#define JAXRING_HOST_DEVICE __host__ __device__
#else
#define JAXRING_HOST_DEVICE
#endif

namespace jaxring {

JAXRING_HOST_DEVICE inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
JAXRING_HOST_DEVICE inline int64_t Max(int64_t a, int64_t b) { return a < b ? b : a; }
JAXRING_HOST_DEVICE inline int64_t Mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

// Python reads these values from the compiled module (MODES), never restates them.
enum class Mode : int64_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

// Each collective as the ring's phases: the one description of a Mode that the schedule,
// the one-shot lanes (ring_protocol.h), the workspace and the attributes
// (ring_handler_common.h) read; Python's twin is jaxring/collectives/kinds.py. A
// reduce-scatter phase leaves each rank its chunk of the sum of a full buffer of N chunks;
// an all-gather phase gives every rank every rank's chunk of it.
struct ModeTraits {
  const char* name;  // Python's name for it (MODES); null for a value that is no Mode
  bool reduces;      // a reduce-scatter phase
  bool gathers;      // an all-gather phase
  // Without a reduce-scatter the input is this rank's chunk; without an all-gather, the output.
  JAXRING_HOST_DEVICE constexpr bool input_is_chunk() const { return !reduces; }
  JAXRING_HOST_DEVICE constexpr bool output_is_chunk() const { return !gathers; }
};

// No default, and a missing Mode is an error here: a new collective does not compile
// until it is described, rather than running another one's arithmetic.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
JAXRING_HOST_DEVICE constexpr ModeTraits TraitsOf(Mode mode) {
  switch (mode) {
    case Mode::kAllReduce:
      return ModeTraits{"allreduce", true, true};
    case Mode::kReduceScatter:
      return ModeTraits{"reduce_scatter", true, false};
    case Mode::kAllGather:
      return ModeTraits{"all_gather", false, true};
  }
  return ModeTraits{nullptr, false, false};  // a value from outside (an attribute) that names no Mode
}
#pragma GCC diagnostic pop

// Chunk c covers [Offset(c), Offset(c) + Size(c)). The buffer is cut in units
// of `align` elements and the remainder spread one unit each over the first
// chunks, so any size works (sizes below N give empty chunks) and, with
// align = 16 bytes / element size, every chunk and slice starts 16-byte
// aligned for the vectorised kernels. reduce_scatter and all_gather use
// align = 1 on buffers the caller padded to N equal chunks.
// Made once (Make divides); Offset and Size, which the lanes call per stage,
// only multiply and compare.
struct Chunking {
  int64_t elements;
  int64_t ranks;
  int64_t align;
  int64_t base_units;   // units of every chunk
  int64_t extra_units;  // chunks 0 .. extra_units - 1 have one more
  JAXRING_HOST_DEVICE static Chunking Make(int64_t elements, int64_t ranks, int64_t align) {
    const int64_t units = (elements + align - 1) / align;
    return Chunking{elements, ranks, align, units / ranks, units % ranks};
  }
  JAXRING_HOST_DEVICE int64_t Offset(int64_t c) const {
    return Min(elements, (c * base_units + Min(c, extra_units)) * align);
  }
  JAXRING_HOST_DEVICE int64_t Size(int64_t c) const { return Offset(c + 1) - Offset(c); }
};

// a mod n for a in [-2n, 2n): the schedule's chunk indices, without a division.
JAXRING_HOST_DEVICE inline int64_t Wrap(int64_t a, int64_t n) {
  if (a < 0) a += n;
  if (a < 0) a += n;
  if (a >= n) a -= n;
  return a;
}

enum class StageKind {
  kSeed,         // out[dst] = in[src]                 (all-gather's own chunk)
  kReduceFirst,  // acc[dst] = in[src] + left.in[src]
  kReduce,       // acc[dst] = in[src] + left.acc[src]
  kReduceLast,   // out[dst] = in[src] + left.acc[src] (or left.in when N = 2)
  kCopy,         // out[dst] = left.out[src]
};

struct Stage {
  StageKind kind;
  bool left_is_input;  // for kReduceLast: the left's data is its input (N = 2)
  int64_t src;         // element offset in the source buffers
  int64_t dst;         // element offset in the destination buffer
  int64_t count;
  int64_t wait_left;   // left's progress needed before this stage
  int64_t wait_right;  // right's progress needed before this stage writes
};

// The schedule of one rank as a function of the stage index, so that a
// device kernel can walk it without a host-built list (ring_protocol.h);
// BuildSchedule below is the same walk collected on the host.
struct SchedulePlan {
  Mode mode;
  Chunking chunks;
  int64_t rank;
  int64_t slices;     // per step
  int64_t slice_len;  // elements, whole units of chunks.align

  // `total_elements` is the size of the full (all-reduced) buffer;
  // `slice_elements` bounds a stage's size.
  JAXRING_HOST_DEVICE static SchedulePlan Make(Mode mode, int64_t total_elements,
                                               int64_t ranks, int64_t rank,
                                               int64_t slice_elements, int64_t align) {
    const Chunking chunks = Chunking::Make(total_elements, ranks, align);
    const int64_t max_chunk = chunks.Size(0);
    const int64_t slice_cap = Max(slice_elements, int64_t{1});
    const int64_t slices = Max(int64_t{1}, (max_chunk + slice_cap - 1) / slice_cap);
    // Slices are whole units too, so they keep the chunk's alignment.
    const int64_t slice_len = ((max_chunk + slices - 1) / slices + align - 1) / align * align;
    return SchedulePlan{mode, chunks, rank, slices, slice_len};
  }

  JAXRING_HOST_DEVICE int64_t ranks() const { return chunks.ranks; }
  // Steps before the all-gather: the reduce-scatter's N-1, or one seeding
  // step (all-gather's own chunk; a ring of one's copy).
  JAXRING_HOST_DEVICE int64_t FirstSteps() const {
    return (!TraitsOf(mode).reduces || ranks() == 1) ? 1 : ranks() - 1;
  }
  JAXRING_HOST_DEVICE int64_t GatherSteps() const {
    return TraitsOf(mode).gathers ? ranks() - 1 : 0;
  }
  // Elements of this rank's output.
  JAXRING_HOST_DEVICE int64_t OutputElements() const {
    return TraitsOf(mode).output_is_chunk() ? chunks.Size(rank) : chunks.elements;
  }
  // The same number of stages on every rank (empty slices included), so that
  // progress counts line up between neighbours.
  JAXRING_HOST_DEVICE int64_t StageCount() const {
    return (FirstSteps() + GatherSteps()) * slices;
  }

  // Stage `index` (< StageCount()).
  JAXRING_HOST_DEVICE Stage StageAt(int64_t index) const {
    return StageAt(index / slices, index % slices);
  }

  // Slice k of step `step`, stage step * slices + k, without a division (the
  // device lanes walk the stages with it). Stage (t, k) of a rank needs stage
  // (t - 1, k) of its left neighbour: progress (t - 1) * slices + k + 1.
  JAXRING_HOST_DEVICE Stage StageAt(int64_t step, int64_t k) const {
    const int64_t n = ranks();
    const ModeTraits traits = TraitsOf(mode);
    StageKind kind = StageKind::kCopy;
    int64_t chunk = 0, dst_base = 0, wait_right = 0;
    bool left_is_input = false;
    if (step < FirstSteps()) {
      if (traits.input_is_chunk()) {
        // The input is the own chunk alone; place it in the output first.
        kind = StageKind::kSeed;
        chunk = rank;
        dst_base = chunks.Offset(rank);
      } else if (n == 1) {
        kind = StageKind::kSeed;  // a ring of one: a copy
      } else {
        chunk = Wrap(rank - step - 2, n);
        kind = step == 0 ? StageKind::kReduceFirst : StageKind::kReduce;
        dst_base = chunks.Offset(chunk);
        if (step == n - 2) {
          kind = StageKind::kReduceLast;
          if (traits.output_is_chunk()) dst_base = 0;  // the output is the chunk alone
        }
        left_is_input = step == 0;
      }
    } else {
      const int64_t s = step - FirstSteps();
      chunk = Wrap(rank - s - 1, n);
      dst_base = chunks.Offset(chunk);
      // When partial sums live in the output buffer, this chunk is what the
      // right neighbour reads in its reduce-scatter step s: do not overwrite
      // it before the right neighbour has read it.
      if (traits.reduces) wait_right = s * slices + k + 1;
    }
    const int64_t src_base = kind == StageKind::kSeed ? 0 : chunks.Offset(chunk);
    const int64_t begin = Min(k * slice_len, chunks.Size(chunk));
    const int64_t end = Min((k + 1) * slice_len, chunks.Size(chunk));
    return Stage{kind,          left_is_input,
                 src_base + begin, dst_base + begin,
                 end - begin,   step == 0 ? 0 : (step - 1) * slices + k + 1,
                 wait_right};
  }
};

// The stages rank `rank` runs, in order.
inline std::vector<Stage> BuildSchedule(Mode mode, int64_t total_elements,
                                        int64_t ranks, int64_t rank,
                                        int64_t slice_elements, int64_t align) {
  std::vector<Stage> stages;
  if (ranks < 1 || rank < 0 || rank >= ranks || align < 1) return stages;
  const SchedulePlan plan =
      SchedulePlan::Make(mode, total_elements, ranks, rank, slice_elements, align);
  for (int64_t i = 0; i < plan.StageCount(); ++i) stages.push_back(plan.StageAt(i));
  return stages;
}

// Progress the right neighbour must reach before a rank may return: it has
// read everything it will read from this rank's buffers.
inline int64_t FinalWaitRight(const std::vector<Stage>& stages) {
  return static_cast<int64_t>(stages.size());
}

}  // namespace jaxring
