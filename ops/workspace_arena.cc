#include "workspace_arena.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>

#include "dlpack/dlpack.h"
#include "tvm/runtime/c_backend_api.h"

namespace tf_dietcode {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kGranule = size_t{64} << 10;  // capacities are multiples
constexpr size_t kInitialCapacity = size_t{256} << 10;

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// One thread's arena: workspaces are [0, top) of one buffer. TVM frees a
// kernel's workspaces in reverse order of allocation (LowerTVMBuiltin nests
// them), so a free pops back to where its workspace began. Plain data, so
// each access costs one TLS lookup and no constructor check.
struct Arena {
  char* base;
  size_t capacity;
  size_t top;
  size_t needed;  // the most wanted at once, for the next growth
};

thread_local Arena arena;

// Frees the buffer of a thread's arena when the thread ends.
struct ArenaOwner {
  ~ArenaOwner() {
    std::free(arena.base);
    arena = Arena{};
  }
};

// Only while nothing is live: the old buffer is dropped, not copied. Out of
// memory, the arena stays empty and TVM's pool serves the thread.
void Grow(Arena& a) {
  thread_local ArenaOwner owner;
  (void)owner;
  const size_t capacity =
      RoundUp(std::max({a.needed, 2 * a.capacity, kInitialCapacity}), kGranule);
  std::free(a.base);
  a.base = static_cast<char*>(std::aligned_alloc(kAlignment, capacity));
  a.capacity = a.base == nullptr ? 0 : capacity;
}

}  // namespace

void* ArenaAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                          int dtype_code_hint, int dtype_bits_hint) {
  if (device_type == kDLCPU) {
    Arena& a = arena;
    if (a.top == 0 && (a.base == nullptr || a.needed > a.capacity)) Grow(a);
    const size_t end =
        a.top + RoundUp(std::max<uint64_t>(nbytes, 1), kAlignment);
    if (end <= a.capacity) {
      void* ptr = a.base + a.top;
      a.top = end;
      return ptr;
    }
    a.needed = std::max(a.needed, end);
  }
  return TVMBackendAllocWorkspace(device_type, device_id, nbytes,
                                  dtype_code_hint, dtype_bits_hint);
}

int ArenaFreeWorkspace(int device_type, int device_id, void* ptr) {
  Arena& a = arena;
  char* p = static_cast<char*>(ptr);
  if (device_type == kDLCPU && p >= a.base && p < a.base + a.top) {
    a.top = static_cast<size_t>(p - a.base);
    return 0;
  }
  return TVMBackendFreeWorkspace(device_type, device_id, ptr);
}

}  // namespace tf_dietcode
