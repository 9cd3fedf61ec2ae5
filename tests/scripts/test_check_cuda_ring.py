"""The GPU correctness harness's script (scripts/check_cuda_ring.py) hands every dtype to the harness."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.testing_modules import built_test_module

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
built_test_module("jaxring.collectives._jaxring_cuda_harness")
sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("check_cuda_ring", ROOT / "scripts" / "check_cuda_ring.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


@pytest.mark.parametrize("reduction", ["sum", "max"])
@pytest.mark.parametrize("dtype", list(check.DTYPES))
@pytest.mark.parametrize("mode", list(check.MODES))
def test_every_dtype_reaches_the_gpu(dtype, mode, reduction):
    """The first GPU run (2026-11-26) stopped at bfloat16: nanobind refused ml_dtypes' arrays
    with a TypeError before the harness ran. Without a GPU the call must get as far as CUDA,
    or be refused where the ring refuses the reduction (max of complex, sum of bool)."""
    reference = check.Reference(np.random.default_rng(3), dtype, 3, 7, reduction)
    refused = mode != "all_gather" and (dtype == "bool" if reduction == "sum" else dtype.startswith("complex"))
    try:
        ok, message = check.check_case("host", "auto", mode, reference, 5.0)
    except RuntimeError as e:  # no GPU on this machine: the harness ran up to its first CUDA call
        assert not refused and "cudaSetDevice" in str(e)
    else:
        assert (ok is None) == refused and (ok or refused), message
