// Which instruction-set extensions the low-precision kernels may use here.
//
// The op library is compiled for x86-64-v3 (AVX2, FMA); kernels for newer
// extensions (AVX-512 VNNI / BF16, AMX) are compiled with per-function target
// attributes and chosen at run time from CPUID and the OS's saved state, so
// one library serves every x86-64-v3 CPU and never executes an instruction
// the CPU lacks.
#ifndef TF_DIETCODE_OPS_CPU_ISA_H_
#define TF_DIETCODE_OPS_CPU_ISA_H_

namespace tf_dietcode {

struct CpuIsa {
  bool avx512 = false;       // AVX-512 F, BW, VL, DQ with the OS saving ZMM state
  bool avx512_vnni = false;  // vpdpbusd on ZMM
  bool avx512_bf16 = false;  // vdpbf16ps on ZMM
  bool amx_int8 = false;     // AMX tiles with int8 dot products, granted by the OS
  bool amx_bf16 = false;     // AMX tiles with bf16 dot products, granted by the OS
};

// The extensions this CPU has, less those named in the environment variable
// TF_DIETCODE_DISABLE_ISA (comma separated, /proc/cpuinfo's spelling:
// avx512f, avx512_vnni, avx512_bf16, amx_int8, amx_bf16, amx_tile), which is
// read on every call so that tests can run each kernel a CPU supports.
// Disabling avx512f disables every AVX-512 extension; amx_tile every AMX one.
// AMX is reported only once the OS has granted this process the tile state
// (requested on first use with arch_prctl(ARCH_REQ_XCOMP_PERM)).
CpuIsa UsableIsa();

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_CPU_ISA_H_
