"""The host-staged CUDA engine (csrc/cuda/staged_engine.cu) with many executions in flight, started in any order.

Its meeting (csrc/cuda/staged_meeting.h, on core/meeting.h as every engine's) and its walk through the schedule
run as on a GPU, from host threads (csrc/testing/module_engine_test.cc): only the stages' work is done on host
memory, each stage when it is enqueued, which is when its stream would run it once the neighbours' events it
waits on completed. A call that met another execution's call would sum the wrong buffers."""

import numpy as np
import pytest

from jaxring.collectives import _ffi
from tests.jaxring.collectives.test_cpu_engine_executions import _check, _inputs, _orders
from tests.testing_modules import built_test_module

engine_test = built_test_module("jaxring.collectives._jaxring_engine_test")


@pytest.mark.parametrize("ranks, in_flight, how", [
    (2, 3, "reversed_on_odd_ranks"), (4, 4, "shuffled"), (8, 2, "shuffled"), (3, 5, "same"),
])
def test_executions_started_in_any_order_each_sum_their_own_data(ranks, in_flight, how):
    rng = np.random.default_rng(ranks * 31 + in_flight)
    x = _inputs(rng, 16, 2, ranks, 1001)
    out = np.full_like(x, np.nan)
    assert engine_test.meet_host_staged(x, out, _orders(rng, ranks, 16, in_flight, how), in_flight) == []
    _check(x, out)


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_every_stage_reduces_by_the_call_s_reduction(reduction):
    """Max and min of floats without NaN: one answer under every platform's rule."""
    rng = np.random.default_rng(46)
    ranks, runs = 3, 6
    x = _inputs(rng, runs, 1, ranks, 1001)
    out = np.full_like(x, np.nan)
    orders = _orders(rng, ranks, runs, 2, "shuffled")
    assert engine_test.meet_host_staged(x, out, orders, 2, reduction=_ffi.reductions()[reduction]) == []
    expected = getattr(x, reduction)(axis=2, keepdims=True)
    np.testing.assert_array_equal(out, np.broadcast_to(expected, out.shape))


def test_a_rank_that_never_comes_is_named_with_its_latest_call_and_other_executions_go_on():
    rng = np.random.default_rng(4)
    ranks, runs = 4, 6
    x = _inputs(rng, runs, 1, ranks, 257)
    out = np.full_like(x, np.nan)
    orders = [list(range(runs)) for _ in range(ranks)]
    orders[2].remove(3)  # rank 2 skips run 3, as a program whose device 2 took another branch
    errors = engine_test.meet_host_staged(x, out, orders, 2, timeout_ms=1000)
    assert len(errors) == ranks - 1, errors
    for error in errors:
        assert "run 3:" in error
        assert "timed out waiting for rank(s) [2] that never arrived (rank 2's latest call of this op was in" in error
        assert "in execution 1003 (call 1 of this op there)" in error
    others = [r for r in range(runs) if r != 3]
    _check(x[others], out[others])


def test_a_rank_that_comes_after_the_others_gave_up_fails_at_once_and_nobody_runs_a_stage():
    rng = np.random.default_rng(5)
    ranks, runs = 4, 3
    x = _inputs(rng, runs, 1, ranks, 4099)
    out = np.full_like(x, np.nan)
    errors = engine_test.meet_host_staged(x, out, [list(range(runs))] * ranks, 1, timeout_ms=150, late_rank=2)
    assert len(errors) == runs * ranks, errors
    assert all("timed out waiting for rank(s) [2] that never arrived" in e for e in errors), errors
    assert np.isnan(out).all(), "a rank ran a stage of a call that had failed"
