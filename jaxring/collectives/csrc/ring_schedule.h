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
// has finished; every wait is "neighbour's progress >= n", which both the CPU
// (condition variable) and CUDA (host-side wait, then an event wait) handlers
// can express.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace jaxring {

// Python reads these values from the compiled module (MODES), never restates them.
enum class Mode : int64_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

// Chunk c covers [Offset(c), Offset(c) + Size(c)). The buffer is cut in units
// of `align` elements and the remainder spread one unit each over the first
// chunks, so any size works (sizes below N give empty chunks) and, with
// align = 16 bytes / element size, every chunk and slice starts 16-byte
// aligned for the vectorised kernels. reduce_scatter and all_gather use
// align = 1 on buffers the caller padded to N equal chunks.
struct Chunking {
  int64_t elements;
  int64_t ranks;
  int64_t align;
  int64_t Units() const { return (elements + align - 1) / align; }
  int64_t Offset(int64_t c) const {
    const int64_t units = Units();
    return std::min(elements,
                     (c * (units / ranks) + std::min(c, units % ranks)) * align);
  }
  int64_t Size(int64_t c) const { return Offset(c + 1) - Offset(c); }
};

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

inline int64_t Mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

// The stages rank `rank` runs, in order. `total_elements` is the size of the
// full (all-reduced) buffer; `slice_elements` bounds a stage's size.
inline std::vector<Stage> BuildSchedule(Mode mode, int64_t total_elements,
                                        int64_t ranks, int64_t rank,
                                        int64_t slice_elements, int64_t align) {
  std::vector<Stage> stages;
  if (ranks < 1 || rank < 0 || rank >= ranks || align < 1) return stages;
  const Chunking chunks{total_elements, ranks, align};
  const int64_t max_chunk = chunks.Size(0);
  const int64_t slices =
      std::max<int64_t>(1, (max_chunk + std::max<int64_t>(slice_elements, 1) - 1) /
                               std::max<int64_t>(slice_elements, 1));
  // Slices are whole units too, so they keep the chunk's alignment.
  const int64_t slice_len =
      ((max_chunk + slices - 1) / slices + align - 1) / align * align;
  // The same number of stages on every rank (empty slices included), so that
  // progress counts line up between neighbours. Stage (t, k) of a rank needs
  // stage (t - 1, k) of its left neighbour: progress (t - 1) * slices + k + 1.
  int64_t step_index = 0;
  auto add_step = [&](StageKind kind, int64_t chunk, int64_t src_base,
                      int64_t dst_base, bool left_is_input) {
    for (int64_t k = 0; k < slices; ++k) {
      const int64_t begin = std::min(k * slice_len, chunks.Size(chunk));
      const int64_t end = std::min((k + 1) * slice_len, chunks.Size(chunk));
      stages.push_back(Stage{
          kind, left_is_input, src_base + begin, dst_base + begin, end - begin,
          step_index == 0 ? 0 : (step_index - 1) * slices + k + 1,
          /*wait_right=*/0});
    }
    ++step_index;
  };

  const int64_t steps = ranks - 1;
  if (mode == Mode::kAllGather) {
    // The input is the own chunk alone; place it in the output first.
    add_step(StageKind::kSeed, rank, 0, chunks.Offset(rank), false);
  } else if (steps == 0) {
    add_step(StageKind::kSeed, 0, 0, 0, false);  // a ring of one: a copy
  } else {
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t chunk = Mod(rank - s - 2, ranks);
      const bool last = s == steps - 1;
      StageKind kind = s == 0 ? StageKind::kReduceFirst : StageKind::kReduce;
      int64_t dst = chunks.Offset(chunk);
      if (last) {
        kind = StageKind::kReduceLast;
        if (mode == Mode::kReduceScatter) dst = 0;  // the output is the chunk alone
      }
      add_step(kind, chunk, chunks.Offset(chunk), dst, /*left_is_input=*/s == 0);
    }
  }
  if (mode == Mode::kReduceScatter) return stages;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t chunk = Mod(rank - s - 1, ranks);
    const size_t first = stages.size();
    add_step(StageKind::kCopy, chunk, chunks.Offset(chunk), chunks.Offset(chunk),
             false);
    if (mode == Mode::kAllReduce) {
      // When partial sums live in the output buffer, this chunk is what the
      // right neighbour reads in its reduce-scatter step s: do not overwrite
      // it before the right neighbour has read it.
      for (size_t i = first; i < stages.size(); ++i) {
        stages[i].wait_right = s * slices + static_cast<int64_t>(i - first) + 1;
      }
    }
  }
  return stages;
}

// Progress the right neighbour must reach before a rank may return: it has
// read everything it will read from this rank's buffers.
inline int64_t FinalWaitRight(const std::vector<Stage>& stages) {
  return static_cast<int64_t>(stages.size());
}

}  // namespace jaxring
