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
  const auto address = reinterpret_cast<uintptr_t>(data.data());
  const uintptr_t begin = (address + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (address + data.size()) & ~(kHugePage - 1);
  if (end <= begin) return;  // no whole huge page inside the buffer
  void* start = reinterpret_cast<void*>(begin);
  // HUGEPAGE keeps the range eligible (khugepaged, later faults) where
  // COLLAPSE is unsupported; failures only leave the 4 KiB pages.
  madvise(start, end - begin, MADV_HUGEPAGE);
  madvise(start, end - begin, MADV_COLLAPSE);
}

}  // namespace tf_dietcode
