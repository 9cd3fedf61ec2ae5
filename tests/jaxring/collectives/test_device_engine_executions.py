"""The device engine (csrc/cuda/device_engine.*) with many executions in flight, started in any order.

JAX queues executions without waiting for them, so a rank may be in several
executions of a program at once and its handler threads may reach them in any
order. The calls of one execution meet each other (XLA's RunId and the call's
occurrence there) on flags of their own. The fake CUDA of
csrc/testing/module_engine_test.cc plays every launch: ring_protocol.h's lanes run on a
host thread over the flags and buffers the engine gave the kernel, with no
order between launches (as if each had a stream of its own), so a kernel that
read another execution's flags or buffers shows as a wrong sum or a timeout.
"""

import numpy as np
import pytest

from jaxring.collectives import _ffi
from tests.jaxring.collectives.test_cpu_engine_executions import _check, _inputs, _orders
from tests.testing_modules import built_test_module

engine_test = built_test_module("jaxring.collectives._jaxring_engine_test")


def _queue_and_check(rng, ranks, runs, occurrences, elements, in_flight, how, path, max_sessions=16):
    fake = engine_test.Fake(ranks, max_sessions=max_sessions, play=True, one_shot_max_bytes=8192)
    x = _inputs(rng, runs, occurrences, ranks, elements)
    out = np.full_like(x, np.nan)
    assert fake.queue(x, out, _orders(rng, ranks, runs, in_flight, how), in_flight, path) == []
    _check(x, out)


@pytest.mark.parametrize("path", ["ring", "one_shot"])
@pytest.mark.parametrize("ranks, in_flight, how", [
    (2, 3, "reversed_on_odd_ranks"), (4, 4, "shuffled"), (8, 2, "shuffled"), (3, 5, "same"),
])
def test_executions_started_in_any_order_each_sum_their_own_data(path, ranks, in_flight, how):
    _queue_and_check(np.random.default_rng(ranks * 17 + in_flight), ranks, 24, 2, 1001, in_flight, how, path)


@pytest.mark.parametrize("path", ["ring", "one_shot"])
@pytest.mark.parametrize("reduction", ["max", "min"])
def test_the_call_s_reduction_reaches_every_lane_of_every_execution(path, reduction):
    """The reduction travels from the call (RingCall) into the kernel's arguments; the played kernel
    reduces by it (max and min of floats without NaN: one answer under every platform's rule)."""
    rng = np.random.default_rng(45)
    ranks, runs = 4, 8
    fake = engine_test.Fake(ranks, play=True, one_shot_max_bytes=8192)
    x = _inputs(rng, runs, 1, ranks, 1001)
    out = np.full_like(x, np.nan)
    orders = _orders(rng, ranks, runs, 3, "shuffled")
    assert fake.queue(x, out, orders, 3, path, reduction=_ffi.reductions()[reduction]) == []
    expected = getattr(x, reduction)(axis=2, keepdims=True)
    np.testing.assert_array_equal(out, np.broadcast_to(expected, out.shape))


def test_more_executions_in_flight_than_sessions_wait_for_the_device_and_stay_apart():
    """Two sessions for up to six executions in flight: a meeting waits until one
    session's kernels have ended, and its flags serve the next execution."""
    _queue_and_check(np.random.default_rng(7), 4, 30, 1, 4099, 6, "shuffled", "auto", max_sessions=2)


def test_a_rank_that_never_comes_is_named_and_other_executions_go_on():
    rng = np.random.default_rng(8)
    ranks, runs = 3, 6
    fake = engine_test.Fake(ranks, play=True)
    x = _inputs(rng, runs, 1, ranks, 257)
    out = np.full_like(x, np.nan)
    orders = [list(range(runs)) for _ in range(ranks)]
    orders[1].remove(2)  # rank 1 skips run 2, as a program whose device 1 took another branch
    errors = fake.queue(x, out, orders, 2, timeout_ms=500)
    assert len(errors) == ranks - 1, errors
    for error in errors:
        assert "run 2:" in error and "in execution 1002 (call 1 of this op there)" in error
        assert "rank(s) [1] that never arrived (rank 1's latest call of this op was in execution" in error
    assert np.isnan(out[2]).all(), "a rank launched for a meeting that failed"
    others = [r for r in range(runs) if r != 2]
    _check(x[others], out[others])


@pytest.mark.parametrize("path", ["ring", "one_shot"])
def test_a_rank_that_comes_after_the_others_gave_up_launches_nothing(path):
    """The others time out and return (XLA then frees their buffers); the late rank
    must fail without a kernel that would read or write them."""
    rng = np.random.default_rng(9)
    ranks, runs = 4, 3
    fake = engine_test.Fake(ranks, play=True)
    x = _inputs(rng, runs, 1, ranks, 4099)
    out = np.full_like(x, np.nan)
    errors = fake.queue(x, out, [list(range(runs))] * ranks, 1, path, timeout_ms=150, late_rank=2)
    assert len(errors) == runs * ranks, errors
    assert all("rank(s) [2] that never arrived" in e for e in errors), errors
    assert np.isnan(out).all(), "a rank launched for a meeting that had failed"
