# `make test` and `make train` do all the set-up from a fresh clone: a
# virtual environment in .venv, the dependencies, and the compiled handlers.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# mpi4jax builds from source; with nvcc on PATH it needs the real toolkit.
CUDA_ROOT ?= $(firstword $(wildcard /usr/local/cuda-13.0 /usr/local/cuda))
export CUDA_ROOT
SOURCES := $(wildcard jaxring/csrc/*) CMakeLists.txt pyproject.toml

.PHONY: test train bench clean

test: $(VENV)/.installed
	$(PY) -m pytest -q

train: $(VENV)/.installed
	$(PY) scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/ds2_tiny

bench: $(VENV)/.installed
	$(PY) scripts/bench_allreduce.py --json runs/bench_allreduce.json

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Build requirements first: the package builds without isolation, against
# the jax it runs with (the FFI headers come from jaxlib).
$(VENV)/.installed: $(SOURCES) | $(PY)
	$(PY) -m pip install --quiet "scikit-build-core>=0.10" "nanobind>=2.4" ninja "jax>=0.10.2,<0.12"
	$(PY) -m pip install --quiet --no-build-isolation -e ".[test]"
	touch $@

clean:
	rm -rf build $(VENV)
