"""What the GPU harness (scripts/check_cuda_ring.py, bench_cuda_ring.py) checks before it needs a GPU."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.testing_modules import built_test_module

ALLREDUCE, REDUCE_SCATTER = 0, 1


def test_the_gpu_harness_rejects_bad_arguments_before_touching_a_gpu():
    pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
    harness = built_test_module("jaxring.collectives._jaxring_cuda_harness")
    inputs = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16, float16 or int32, got 'float64'"):
        harness.run("device", "auto", ALLREDUCE, "float64", inputs, inputs.copy(), 8, 1 << 20, 1.0)
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
