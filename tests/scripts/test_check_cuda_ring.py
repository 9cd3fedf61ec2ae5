"""The GPU correctness harness's script (scripts/gpu/check_cuda_ring.py) hands every dtype to the harness."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.testing_modules import built_test_module

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
built_test_module("jaxring.collectives._jaxring_cuda_harness")
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
spec = importlib.util.spec_from_file_location("check_cuda_ring", ROOT / "scripts" / "gpu" / "check_cuda_ring.py")
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


class FoldingHarness:
    """harness.run as an engine right by construction: the ranks folded in rank order by the CUDA engines'
    own element rule (combine_on_host, the kernels' Combine run on the host), then `spoil` on rank 1."""

    def __init__(self, spoil=lambda out: None):
        self.element_rule = built_test_module("jaxring.collectives._jaxring_cuda_harness")
        self.spoil = spoil

    def run(self, engine, path, mode, dtype, inputs, outputs, elements, slice_bytes, timeout_s, reduction):
        if reduction != "sum" and dtype.startswith("complex") and mode != check.MODES["all_gather"]:
            raise ValueError("complex numbers have no order")
        x, out = inputs.view(check.DTYPES[dtype]), outputs.view(check.DTYPES[dtype])
        if mode == check.MODES["all_gather"]:
            out[:] = x.reshape(-1)
        else:
            running = x[0].copy()
            for row in x[1:]:
                self.element_rule.combine_on_host(dtype, reduction, running.view(np.uint8), row.view(np.uint8),
                                                  running.view(np.uint8))
            out[:] = running.reshape(out.shape[0], -1) if mode == check.MODES["reduce_scatter"] else running
        self.spoil(out[1])
        return [""] * len(x)


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", "int8", "uint64", "bool"])
@pytest.mark.parametrize("mode", ["allreduce", "reduce_scatter"])
def test_the_engines_element_rule_passes_the_lax_reference(monkeypatch, dtype, mode, reduction):
    """What the GPU stage will find for an engine that folds the ranks by its element rule: agreement with
    lax's max and min, NaNs and signed zeros included (this machine's lax: the same rule as the GPU's)."""
    monkeypatch.setattr(check, "harness", FoldingHarness())
    reference = check.Reference(np.random.default_rng(5), dtype, 3, 1001, reduction)
    assert check.check_case("host", "auto", mode, reference, 5.0) == (True, "")


def _turn_nans_into_zeros(out):
    out[np.isnan(out.astype(np.float64))] = 0


def _flip_the_sign_of_zeros(out):
    out[out.astype(np.float64) == 0] *= -1


@pytest.mark.parametrize("spoil, verdict", [(_turn_nans_into_zeros, "wrong elements"),
                                            (_flip_the_sign_of_zeros, "wrong elements")])
def test_a_dropped_nan_or_a_zero_of_the_wrong_sign_fails_the_case(monkeypatch, spoil, verdict):
    monkeypatch.setattr(check, "harness", FoldingHarness(spoil))
    reference = check.Reference(np.random.default_rng(6), "float32", 3, 1001, "max")
    ok, message = check.check_case("host", "auto", "reduce_scatter", reference, 5.0)
    assert not ok and verdict in message, message
