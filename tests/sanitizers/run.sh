#!/usr/bin/env bash
# The op tests against an AddressSanitizer + UndefinedBehaviorSanitizer build
# of the op library. setup.py builds it (the installed library's flags plus
# the sanitizers') into build/asan/, leaving the installed library alone, and
# TF_DIETCODE_OP_LIBRARY makes tf_dietcode load it. Python and TensorFlow are
# not instrumented: the runtimes are preloaded, and leak checks are off (both
# keep memory to exit by design). The first report of either ends the run.
# Test files spread over the cores as in `make test`.
#   tests/sanitizers/run.sh [pytest arguments]   (default: the op tests)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=build/asan
LIBRARY=$OUT/tf_dietcode/libtf_dietcode_ops.so
# GCC 12 rejects abseil's constexpr function-pointer checks under the null
# sanitizers (they make a function's address possibly null), so those three
# are left out; a null dereference still faults and ASan reports it.
SANITIZE="-fsanitize=address,undefined -fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute"
# setup.py's x86-64-v3 baseline gives Eigen's AVX2 kernels, not its AVX-512
# ones, whose four GEMMs in generic_kernel.cc took g++ 268 s alone under the
# sanitizers, against 34 s (2-vCPU Xeon).
# -g1: line tables, all a report's stack needs (full -g: 331 s against 268).

if [[ ! -f $LIBRARY || -n $(find ops setup.py "$0" -newer "$LIBRARY" -print -quit) ]]; then
  TF_DIETCODE_CXXFLAGS="$SANITIZE -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1 -Wno-interference-size" \
    "$PY" setup.py -q build_ext --build-lib "$OUT" --build-temp "$OUT/obj"
fi

if (($# == 0)); then
  set -- tests/test_fused_matmul.py tests/test_fused_batch_matmul.py tests/test_bad_input.py \
    tests/test_tuned_ops.py tests/test_fuzz.py tests/test_layer_norm.py tests/test_int8_matmul.py \
    tests/test_bf16_matmul.py tests/test_softmax.py
fi
LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
TF_DIETCODE_OP_LIBRARY=$PWD/$LIBRARY \
TF_CPP_MIN_LOG_LEVEL=2 \
  exec "$PY" -m pytest -q -p no:cacheprovider --capture=sys -n auto --maxprocesses 4 --dist loadfile "$@"
