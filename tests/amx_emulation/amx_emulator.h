// The AMX instructions ops/amx_tiles.cc uses, run in software on any x86-64
// CPU, so that the AMX kernels' configuration, addressing and tails are
// checked where no AMX is lent (tests/test_amx_emulated.py). The tile
// registers follow the Intel SDM (palette 1: eight tiles of up to 16 rows of
// 64 bytes); every use the hardware would refuse with #UD or #GP (an
// unconfigured tile, mismatched shapes, a bad configuration) and every tile
// row read or written outside the buffers the test allowed is recorded as a
// fault instead, the first one kept, and the instruction skipped.
#ifndef TF_DIETCODE_TESTS_AMX_EMULATOR_H_
#define TF_DIETCODE_TESTS_AMX_EMULATOR_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace amx_emulator {

constexpr int kTiles = 8;
constexpr int kMaxRows = 16;
constexpr int kMaxColumnBytes = 64;

struct Tile {
  int rows = 0;
  int colsb = 0;
  uint8_t data[kMaxRows][kMaxColumnBytes] = {};
};

struct State {
  bool configured = false;
  Tile tiles[kTiles];
  std::string fault;
  std::vector<std::pair<uintptr_t, uintptr_t>> allowed;  // [begin, end)
};

inline State state;

inline bool Fault(const std::string& what) {
  if (state.fault.empty()) state.fault = what;
  return false;
}

// A usable tile: configured, with rows and columns.
inline bool Usable(int t, const char* instruction) {
  if (!state.configured) return Fault(std::string(instruction) + " before LDTILECFG (#UD)");
  if (t < 0 || t >= kTiles || state.tiles[t].rows == 0) {
    return Fault(std::string(instruction) + " on tmm" + std::to_string(t) + ", not configured (#UD)");
  }
  return true;
}

// Whether [p, p + bytes) lies in one allowed buffer.
inline bool Allowed(const void* p, int64_t bytes, const char* instruction) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  for (const auto& [low, high] : state.allowed) {
    if (begin >= low && begin + bytes <= high) return true;
  }
  char where[160];
  std::snprintf(where, sizeof(where), "%s touches %lld bytes at %p, outside every buffer",
                instruction, static_cast<long long>(bytes), p);
  return Fault(where);
}

inline void LoadConfig(const void* config) {
  const auto* bytes = static_cast<const uint8_t*>(config);
  if (bytes[0] != 1) {
    Fault("LDTILECFG palette " + std::to_string(bytes[0]) + ", only 1 emulated");
    return;
  }
  if (bytes[1] != 0) {
    Fault("LDTILECFG start_row must be 0");
    return;
  }
  for (int i = 2; i < 16; ++i) {
    if (bytes[i] != 0) {
      Fault("LDTILECFG reserved byte " + std::to_string(i) + " not zero (#GP)");
      return;
    }
  }
  for (int t = 0; t < 16; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, bytes + 16 + 2 * t, sizeof(colsb));
    const int rows = bytes[48 + t];
    const bool bad = t >= kTiles ? (rows != 0 || colsb != 0)
                                 : (rows > kMaxRows || colsb > kMaxColumnBytes ||
                                    (rows == 0) != (colsb == 0));
    if (bad) {
      Fault("LDTILECFG tmm" + std::to_string(t) + ": " + std::to_string(rows) +
            " rows of " + std::to_string(colsb) + " bytes (#GP)");
      return;
    }
    if (t < kTiles) state.tiles[t] = Tile{rows, colsb, {}};
  }
  state.configured = true;
}

inline void Release() {
  state.configured = false;
  for (Tile& tile : state.tiles) tile = Tile{};
}

inline void Zero(int t) {
  if (Usable(t, "TILEZERO")) std::memset(state.tiles[t].data, 0, sizeof(state.tiles[t].data));
}

inline void Load(int t, const void* base, int64_t stride) {
  if (!Usable(t, "TILELOADD")) return;
  Tile& tile = state.tiles[t];
  std::memset(tile.data, 0, sizeof(tile.data));
  for (int r = 0; r < tile.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(base) + r * stride;
    if (!Allowed(row, tile.colsb, "TILELOADD")) return;
    std::memcpy(tile.data[r], row, tile.colsb);
  }
}

inline void Store(int t, void* base, int64_t stride) {
  if (!Usable(t, "TILESTORED")) return;
  const Tile& tile = state.tiles[t];
  for (int r = 0; r < tile.rows; ++r) {
    auto* row = static_cast<uint8_t*>(base) + r * stride;
    if (!Allowed(row, tile.colsb, "TILESTORED")) return;
    std::memcpy(row, tile.data[r], tile.colsb);
  }
}

// The shape rules of the dot-product instructions (SDM: #UD unless
// dst.colsb == b.colsb, dst.rows == a.rows, a.colsb / 4 == b.rows, and the
// three tiles distinct).
inline bool DotShapes(int c, int a, int b, const char* instruction) {
  if (!Usable(c, instruction) || !Usable(a, instruction) || !Usable(b, instruction)) return false;
  const Tile &tc = state.tiles[c], &ta = state.tiles[a], &tb = state.tiles[b];
  if (c == a || c == b || a == b || tc.colsb != tb.colsb || tc.rows != ta.rows ||
      ta.colsb / 4 != tb.rows || ta.colsb % 4 != 0 || tc.colsb % 4 != 0) {
    char what[200];
    std::snprintf(what, sizeof(what),
                  "%s tmm%d[%dx%dB] += tmm%d[%dx%dB] . tmm%d[%dx%dB]: shapes disagree (#UD)",
                  instruction, c, tc.rows, tc.colsb, a, ta.rows, ta.colsb, b, tb.rows, tb.colsb);
    return Fault(what);
  }
  return true;
}

// dst[m][n] = add(dst[m][n], a's group k of row m, b's group k of column n)
// over k: a dot-product instruction, its 4-byte sums of type T.
template <class T, class Add>
void Dot(int c, int a, int b, const char* instruction, Add add) {
  if (!DotShapes(c, a, b, instruction)) return;
  Tile &tc = state.tiles[c], &ta = state.tiles[a], &tb = state.tiles[b];
  for (int m = 0; m < tc.rows; ++m) {
    for (int n = 0; n < tc.colsb / 4; ++n) {
      T sum;
      std::memcpy(&sum, tc.data[m] + 4 * n, 4);
      for (int k = 0; k < ta.colsb / 4; ++k) sum = add(sum, ta.data[m] + 4 * k, tb.data[k] + 4 * n);
      std::memcpy(tc.data[m] + 4 * n, &sum, 4);
    }
  }
}

// TDPBSSD: int32 sums of signed byte products, wrapping as the hardware does.
inline void DotInt8(int c, int a, int b) {
  Dot<uint32_t>(c, a, b, "TDPBSSD", [](uint32_t sum, const uint8_t* x, const uint8_t* y) {
    for (int i = 0; i < 4; ++i) {
      sum += static_cast<uint32_t>(static_cast<int8_t>(x[i]) * static_cast<int8_t>(y[i]));
    }
    return sum;
  });
}

// Subnormals read and written as zero (the instruction's DAZ and FTZ).
inline float Flushed(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

inline float Bf16At(const uint8_t* p) {
  uint16_t half;
  std::memcpy(&half, p, 2);
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return Flushed(x);
}

// TDPBF16PS: float32 sums of bfloat16 pair products (the test allows for
// the hardware adding them in another order).
inline void DotBf16(int c, int a, int b) {
  Dot<float>(c, a, b, "TDPBF16PS", [](float sum, const uint8_t* x, const uint8_t* y) {
    for (int i = 0; i < 2; ++i) sum = Flushed(sum + Bf16At(x + 2 * i) * Bf16At(y + 2 * i));
    return sum;
  });
}

}  // namespace amx_emulator

// The intrinsics' names, as <immintrin.h> spells them.
#define _tile_loadconfig(config) ::amx_emulator::LoadConfig(config)
#define _tile_release() ::amx_emulator::Release()
#define _tile_zero(t) ::amx_emulator::Zero(t)
#define _tile_loadd(t, base, stride) ::amx_emulator::Load((t), (base), (stride))
#define _tile_stored(t, base, stride) ::amx_emulator::Store((t), (base), (stride))
#define _tile_dpbssd(c, a, b) ::amx_emulator::DotInt8((c), (a), (b))
#define _tile_dpbf16ps(c, a, b) ::amx_emulator::DotBf16((c), (a), (b))

#endif  // TF_DIETCODE_TESTS_AMX_EMULATOR_H_
