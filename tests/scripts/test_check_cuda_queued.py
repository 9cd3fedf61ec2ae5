"""scripts/gpu/check_cuda_queued.py (gpu_check.sh part 1's cuda-queued stage) before it has a GPU:
the call reaches CUDA, and the verdict catches a step that holds another step's sum."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.testing_modules import built_test_module

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("jaxring.collectives._jaxring_cuda", reason="built without a CUDA toolkit")
built_test_module("jaxring.collectives._jaxring_cuda_harness")
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
import check_cuda_queued  # noqa: E402


def test_the_queued_steps_reach_cuda():
    try:
        ok, message = check_cuda_queued.check_queued(np.random.default_rng(0), "device", "auto", 2, 3, 7, 5.0)
    except RuntimeError as e:  # no GPU on this machine: the harness ran up to its first CUDA call
        assert "cudaSetDevice" in str(e)
    else:
        assert ok, message


class SummingHarness:
    """harness.queue as a correct engine would fill `outputs`, then `spoil` applied."""

    def __init__(self, spoil):
        self.spoil = spoil

    def queue(self, engine, path, mode, dtype, inputs, outputs, elements, slice_bytes, timeout_s, reduction):
        assert dtype == "float32" and reduction == "sum"
        inputs, outputs = inputs.view(np.float32), outputs.view(np.float32)  # the script hands over bytes
        steps, k = inputs.shape[:2]
        if mode == check_cuda_queued.MODES["all_gather"]:
            outputs[:] = inputs.reshape(steps, 1, elements)
        else:
            total = inputs.astype(np.float64).sum(axis=1, keepdims=True).astype(np.float32)
            outputs[:] = total.reshape(outputs.shape) if mode == check_cuda_queued.MODES["reduce_scatter"] else total
        self.spoil(outputs)
        return [""] * k


SPOILS = [
    ("none", lambda out: None, ""),
    ("another step's sum", lambda out: out.__setitem__(5, out[4]), "wrong elements in 1 steps; first: step 5 rank 0"),
    ("a poisoned element", lambda out: out.__setitem__((3, 1, 2), np.nan),
     "1 wrong elements in 1 steps; first: step 3 rank 1 element 2"),
    ("one ulp on one replica", lambda out: out.__setitem__((2, 1, 0), np.nextafter(out[2, 1, 0], np.float32(np.inf))),
     "the replicas of a step differ bitwise"),
]
# all_gather must be exact, so one ulp is a wrong element there; reduce_scatter's ranks hold
# different chunks and one ulp is within its bound.
CASES = [(mode, spoil, "1 wrong elements in 1 steps; first: step 2 rank 1 element 0"
          if mode == "all_gather" and name == "one ulp on one replica" else verdict)
         for mode in ("allreduce", "reduce_scatter", "all_gather") for name, spoil, verdict in SPOILS
         if not (mode == "reduce_scatter" and name == "one ulp on one replica")]


@pytest.mark.parametrize("mode, spoil, verdict", CASES)
def test_the_verdict_names_the_step_that_is_wrong(monkeypatch, mode, spoil, verdict):
    monkeypatch.setattr(check_cuda_queued, "harness", SummingHarness(spoil))
    ok, message = check_cuda_queued.check_queued(np.random.default_rng(1), "device", "auto", 3, 8, 1002, 5.0, mode)
    assert ok == (verdict == "") and verdict in message, message
