// Transparent huge pages for the host buffers a collective writes first.
//
// XLA allocates a program's outputs afresh at almost every call, so on the
// host the collective is what first touches their pages. At 4 KiB a page
// that is one fault (and one zeroed page) per 4 KiB, which for large
// buffers costs more than the reduction itself: on 8 host devices, 64 MiB
// each, the faults of the outputs took most of the call
// (docs/PERFORMANCE.md). Asked for huge pages, the kernel faults 2 MiB at a
// time where it has them (transparent_hugepage "always" or "madvise").
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace jaxring {

// Below this the advice gained nothing measurable (at 4 MiB a buffer holds
// one or two whole huge pages; 8 host devices, four interleaved pairs: 1.02x
// psum with it, 1.06x without).
constexpr size_t kHugePageAdviceMinBytes = size_t{8} << 20;

// Advice only: where the kernel has no transparent huge pages (or refuses),
// the buffer is written as before.
inline void AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  if (bytes < kHugePageAdviceMinBytes) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace jaxring
