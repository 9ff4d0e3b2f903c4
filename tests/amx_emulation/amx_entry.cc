// C entry points to the emulated AMX kernels of ops/amx_tiles.cc, for ctypes
// (tests/test_amx_emulated.py).
#include "amx_emulator.h"
#include "low_precision_tiles.h"

extern "C" {

// Forgets the tile state, the first fault and the allowed buffers.
void amx_emulation_reset() { amx_emulator::state = amx_emulator::State{}; }

// Lets tile loads and stores touch [p, p + bytes).
void amx_emulation_allow(const void* p, int64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  amx_emulator::state.allowed.emplace_back(begin, begin + bytes);
}

// The first fault since the last reset, "" if none.
const char* amx_emulation_fault() { return amx_emulator::state.fault.c_str(); }

// Whether the tiles are still configured (LDTILECFG not undone by TILERELEASE).
int amx_emulation_configured() { return amx_emulator::state.configured; }

int amx_int8_rows() { return tf_dietcode::kAmxInt8Kernel.rows; }
int amx_int8_row_padding() { return tf_dietcode::kAmxInt8Kernel.row_padding; }
int amx_bf16_rows() { return tf_dietcode::kAmxBf16Kernel.rows; }
int amx_bf16_row_padding() { return tf_dietcode::kAmxBf16Kernel.row_padding; }

void amx_int8_tile(const uint8_t* act, int64_t act_stride, int rows, const uint8_t* w,
                   int64_t groups, int blocks, int32_t* c) {
  tf_dietcode::kAmxInt8Kernel.tile(act, act_stride, rows, w, groups, blocks, c);
}

void amx_bf16_tile(const uint8_t* act, int64_t act_stride, int rows, const uint8_t* w,
                   int64_t groups, int blocks, float* c) {
  tf_dietcode::kAmxBf16Kernel.tile(act, act_stride, rows, w, groups, blocks, c);
}

}  // extern "C"
