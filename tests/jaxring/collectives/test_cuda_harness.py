"""What the GPU harness (scripts/check_cuda_ring.py, bench_cuda_ring.py) checks before it needs a GPU."""

import numpy as np
import pytest

ALLREDUCE, REDUCE_SCATTER = 0, 1


def test_the_gpu_harness_rejects_bad_arguments_before_touching_a_gpu():
    harness = pytest.importorskip("jaxring.collectives._jaxring_cuda_harness", reason="built without a CUDA toolkit")
    inputs = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16, float16 or int32, got 'float64'"):
        harness.run("device", "auto", ALLREDUCE, "float64", inputs, inputs.copy(), 8, 1 << 20, 1.0)
    with pytest.raises(ValueError, match="elements must be a multiple of ranks"):
        harness.run("device", "auto", REDUCE_SCATTER, "float32", inputs, inputs.copy(), 9, 1 << 20, 1.0)
