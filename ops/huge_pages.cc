#include "huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older C headers lack it
#endif

namespace tf_dietcode {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

}  // namespace

void HugePageBacking::Ensure(const tensorflow::Tensor& weight) {
  if (tried_.load(std::memory_order_relaxed) ||
      tried_.exchange(true, std::memory_order_relaxed)) {
    return;
  }
  const auto data = weight.tensor_data();
  if (data.size() < kHugePage) return;  // a small weight stays in the caches
  // Every huge page the buffer touches, its ends included: a weight starts
  // anywhere, so rounding inward left a 768x768 weight (2.4 MB) at most one
  // whole page. The parts of the end pages outside the buffer are the
  // process's other memory, collapsed with the same addresses and contents;
  // a page that is not all one anonymous mapping is refused and stays as is.
  const auto address = reinterpret_cast<uintptr_t>(data.data());
  const uintptr_t begin = address & ~(kHugePage - 1);
  const uintptr_t end = (address + data.size() + kHugePage - 1) & ~(kHugePage - 1);
  void* start = reinterpret_cast<void*>(begin);
  // HUGEPAGE keeps the range eligible (khugepaged, later faults) where
  // COLLAPSE is unsupported; failures only leave the 4 KiB pages.
  madvise(start, end - begin, MADV_HUGEPAGE);
  madvise(start, end - begin, MADV_COLLAPSE);
}

}  // namespace tf_dietcode
