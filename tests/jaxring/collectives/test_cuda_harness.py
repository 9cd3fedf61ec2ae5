"""What the GPU harness (scripts/gpu/check_cuda_ring.py, bench_cuda_ring.py) checks before it needs a GPU, and the
CUDA engines' element rule (csrc/cuda/cuda_elementwise.cuh's Combine) run on the host against jax.lax."""

import os
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

from jaxring.collectives import _ffi
from tests.testing_modules import built_test_module

ALLREDUCE, REDUCE_SCATTER = 0, 1


def test_the_gpu_harness_rejects_bad_arguments_before_touching_a_gpu():
    pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
    harness = built_test_module("jaxring.collectives._jaxring_cuda_harness")
    inputs = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="dtype must be one of float32, .*uint64, bool, got 'float8_e5m2'"):
        harness.run("device", "auto", ALLREDUCE, "float8_e5m2", inputs, inputs.copy(), 8, 1 << 20, 1.0)
    with pytest.raises(ValueError, match="reduction must be sum, max or min, got 'prod'"):
        harness.run("device", "auto", ALLREDUCE, "float32", inputs, inputs.copy(), 8, 1 << 20, 1.0, "prod")
    with pytest.raises(ValueError, match="max of complex64: complex numbers have no order"):
        harness.run("host", "auto", ALLREDUCE, "complex64", inputs, inputs.copy(), 4, 1 << 20, 1.0, "max")
    with pytest.raises(ValueError, match="n the elements each rank gives and gets"):
        harness.run("host", "auto", ALLREDUCE, "float64", inputs, inputs.copy(), 8, 1 << 20, 1.0)
    with pytest.raises(ValueError, match="elements must be a multiple of ranks"):
        harness.run("device", "auto", REDUCE_SCATTER, "float32", inputs, inputs.copy(), 9, 1 << 20, 1.0)
    steps = np.ones((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="must be \\[steps, ranks, n\\] arrays"):
        harness.queue("device", "auto", ALLREDUCE, "float32", inputs, inputs.copy(), 8, 1 << 20, 1.0)
    with pytest.raises(ValueError, match="n the elements each rank gives and gets"):
        harness.queue("device", "auto", ALLREDUCE, "float32", steps, steps.copy(), 9, 1 << 20, 1.0)


def test_a_misspelt_cuda_engine_is_refused_at_the_first_collective_even_on_one_device():
    """JAXRING_CUDA_ENGINE is read once per process, so the check runs in a process of its own.
    A ring of one device never reaches the CUDA handler; the refusal must not wait for one."""
    pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
    program = ("import jax, jaxring\n"
               "jax.pmap(lambda v: jaxring.allreduce(v, 'i'), 'i')(jax.numpy.ones((1, 3)))\n")
    for engine, refused in (("devcie", True), ("device", False), ("host", False)):
        env = dict(os.environ, JAXRING_CUDA_ENGINE=engine, JAX_PLATFORMS="cpu")
        run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
        if refused:
            assert run.returncode != 0
            assert "JAXRING_CUDA_ENGINE is 'devcie'; use 'host'" in run.stderr
        else:
            assert run.returncode == 0, run.stderr


def _operands(rng, dtype, n):
    """Two arrays of n elements: floats with NaNs, infinities, signed zeros and ties among normal values;
    integers over their whole range (sums wrap)."""
    t = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    if t.kind == "b":
        return rng.integers(0, 2, size=(2, n)).astype(bool)
    if t.kind in "iu":
        info = np.iinfo(t)
        return rng.integers(info.min, info.max, size=(2, n), dtype=t, endpoint=True)
    wide = rng.standard_normal((2, 2 * n if t.kind == "c" else n))
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])
    where = rng.random(wide.shape) < 0.3
    wide[where] = rng.choice(specials, size=int(where.sum()))
    wide[1, ::7] = wide[0, ::7]  # ties
    if t.kind == "c":
        return wide.astype(np.float32 if t.itemsize == 8 else np.float64).view(t)
    return wide.astype(t)


def _reference(reduction, a, b):
    """lax.max / lax.min on this (CPU) device, 64-bit types on: XLA's element rule (a NaN propagates, -0 below
    +0); the sum as IEEE adds in the engines' accumulation type (float32 below 32 bits), integers wrapping."""
    if reduction == "sum":
        if a.dtype.kind in "iu":
            return a + b  # numpy wraps, as lax.add does
        parts = a.real.dtype if a.dtype.kind == "c" else a.dtype
        accumulation = np.float64 if np.dtype(parts).itemsize == 8 else np.float32
        with np.errstate(invalid="ignore"):  # inf + -inf
            total = a.view(parts).astype(accumulation) + b.view(parts).astype(accumulation)
        return total.astype(parts).view(a.dtype)
    with jax.enable_x64(True):
        if a.dtype == bool:  # 0 and 1: max and min as bytes
            return np.asarray(getattr(jax.lax, reduction)(a.view(np.uint8), b.view(np.uint8))).view(bool)
        return np.asarray(getattr(jax.lax, reduction)(a, b))


@pytest.mark.parametrize("reduction", ["sum", "max", "min"])
def test_the_cuda_engines_combine_every_dtype_as_xla_s_element_rule(reduction):
    """Combine, ToAcc and Store are the kernels' own (host and device functions), so this is the GPU's
    arithmetic, bit for bit, without a GPU; scripts/gpu/check_cuda_ring.py checks the same on the GPU."""
    pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
    harness = built_test_module("jaxring.collectives._jaxring_cuda_harness")
    rng = np.random.default_rng(45)
    checked = []
    for dtype in _ffi.element_types():
        if (reduction == "sum" and dtype == "bool") or (reduction != "sum" and dtype.startswith("complex")):
            continue  # refused by the ring (core/ring_handler_common.h's RefuseTypeOrReduction)
        a, b = _operands(rng, dtype, 1001)
        out = np.zeros_like(a)
        harness.combine_on_host(dtype, reduction, a.view(np.uint8), b.view(np.uint8), out.view(np.uint8))
        expected = _reference(reduction, a, b)
        parts = a.real.dtype if a.dtype.kind == "c" else a.dtype
        got, want = out.view(parts), expected.view(parts)
        bits = np.dtype(f"u{np.dtype(parts).itemsize}")
        same = got.view(bits) == want.view(bits)
        if np.dtype(parts).kind in "fV":  # any NaN for a NaN (XLA leaves its payload open)
            nan = np.isnan(want.astype(np.float64))
            same = np.where(nan, np.isnan(got.astype(np.float64)), same)
        assert same.all(), (dtype, np.argwhere(~same)[:3].ravel(), got[~same][:3], want[~same][:3])
        checked.append(dtype)
    assert len(checked) >= 12, checked
