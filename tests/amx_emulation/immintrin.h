// Stands in for the compiler's <immintrin.h> when ops/amx_tiles.cc is built
// for tests/test_amx_emulated.py: its AMX intrinsics run in software.
#include "amx_emulator.h"
