#include "cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

namespace tf_dietcode {
namespace {

// Linux's arch_prctl codes and the XSAVE component of AMX's tile data.
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

struct Cpuid {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Cpuid Leaf(unsigned leaf, unsigned subleaf) {
  Cpuid r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) {
    return Cpuid();
  }
  return r;
}

bool Bit(unsigned reg, int bit) { return (reg >> bit) & 1u; }

// XCR0: the register state the OS saves on a context switch.
uint64_t OsSavedState() {
  if (!Bit(Leaf(1, 0).ecx, 27)) return 0;  // no OSXSAVE: no XGETBV
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Asks Linux for permission to use AMX's tile data (off by default for a
// process, since it enlarges the signal frame); true once granted.
bool GrantTileState() {
  uint64_t granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) == 0 &&
      Bit(static_cast<unsigned>(granted >> kXfeatureXtiledata), 0)) {
    return true;
  }
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuIsa Detect() {
  CpuIsa isa;
  const Cpuid l7 = Leaf(7, 0), l7s1 = Leaf(7, 1);
  const uint64_t xcr0 = OsSavedState();
  const bool zmm_saved = (xcr0 & 0xe6) == 0xe6;  // SSE, AVX, opmask, ZMM
  isa.avx512 = zmm_saved && Bit(l7.ebx, 16) && Bit(l7.ebx, 17) &&
               Bit(l7.ebx, 30) && Bit(l7.ebx, 31);  // F, DQ, BW, VL
  isa.avx512_vnni = isa.avx512 && Bit(l7.ecx, 11);
  isa.avx512_bf16 = isa.avx512 && Bit(l7s1.eax, 5);
  const bool tiles = Bit(l7.edx, 24) && ((xcr0 >> 17) & 1) && GrantTileState();
  isa.amx_int8 = tiles && Bit(l7.edx, 25);
  isa.amx_bf16 = tiles && Bit(l7.edx, 22);
  return isa;
}

bool Disabled(const std::string& list, const char* name) {
  std::stringstream names(list);
  std::string item;
  while (std::getline(names, item, ',')) {
    if (item == name) return true;
  }
  return false;
}

}  // namespace

CpuIsa UsableIsa() {
  static const CpuIsa detected = Detect();
  CpuIsa isa = detected;
  const char* env = std::getenv("TF_DIETCODE_DISABLE_ISA");
  if (env == nullptr || *env == '\0') return isa;
  const std::string list(env);
  if (Disabled(list, "avx512f")) isa.avx512 = false;
  if (!isa.avx512 || Disabled(list, "avx512_vnni")) isa.avx512_vnni = false;
  if (!isa.avx512 || Disabled(list, "avx512_bf16")) isa.avx512_bf16 = false;
  const bool no_tiles = Disabled(list, "amx_tile");
  if (no_tiles || Disabled(list, "amx_int8")) isa.amx_int8 = false;
  if (no_tiles || Disabled(list, "amx_bf16")) isa.amx_bf16 = false;
  return isa;
}

}  // namespace tf_dietcode
