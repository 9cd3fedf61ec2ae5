"""The CPU engine with many executions in flight, started in any order.

JAX dispatches asynchronously, so a rank may be in several executions of a
program at once and the ranks may start them in different orders. XLA's CPU
client of today starts one multi-device launch at a time
(test_xla_starts_one_launch_at_a_time), but the engine must not rely on it: the
calls of one execution meet each other (by XLA's RunId), whatever else is in
flight. These tests drive the engine from host threads
(csrc/testing/module_cpu_engine_test.cc) in orders that XLA does not produce today, and
check every output against float64 numpy.
"""

import functools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from jaxring.collectives import _ffi
from tests.testing_modules import built_test_module

engine_test = built_test_module("jaxring.collectives._jaxring_cpu_engine_test")

PATHS = _ffi.cpu_module().CPU_PATHS


def _inputs(rng, runs, occurrences, ranks, elements):
    return rng.standard_normal((runs, occurrences, ranks, elements)).astype(np.float32) + 0.25


def _check(x, out):
    expected = x.astype(np.float64).sum(axis=2, keepdims=True)
    np.testing.assert_allclose(out, np.broadcast_to(expected, out.shape), rtol=1e-5, atol=2e-5 * x.shape[2])
    assert (out == out[:, :, :1]).all(), "the replicas of a sum differ"


def _orders(rng, ranks, runs, in_flight, how):
    """Each rank's order of the runs: the same runs in every window of `in_flight`
    (so every run can gather its ranks, as with any collective), in another order
    within the window on each rank."""
    windows = [list(range(start, min(start + in_flight, runs))) for start in range(0, runs, in_flight)]
    if how == "same":
        return [list(range(runs))] * ranks
    if how == "reversed_on_odd_ranks":
        return [[run for w in windows for run in (w[::-1] if r % 2 else w)] for r in range(ranks)]
    return [[int(run) for w in windows for run in rng.permutation(w)] for _ in range(ranks)]  # "shuffled"


@pytest.mark.parametrize("path", ["push", "ring", "one_shot"])
@pytest.mark.parametrize("ranks, in_flight, how", [
    (2, 3, "reversed_on_odd_ranks"), (4, 4, "shuffled"), (8, 2, "shuffled"), (3, 5, "same"),
])
def test_executions_started_in_any_order_each_sum_their_own_data(path, ranks, in_flight, how):
    _meet_and_check(np.random.default_rng(ranks * 31 + in_flight), ranks, 24, 2, 1001, in_flight, how, path)


def test_more_executions_in_flight_than_ranks_on_a_ring_of_more_ranks_than_the_one_shot_lanes():
    _meet_and_check(np.random.default_rng(3), 18, 10, 1, 333, 3, "shuffled", "auto")


def _meet_and_check(rng, ranks, runs, occurrences, elements, in_flight, how, path):
    x = _inputs(rng, runs, occurrences, ranks, elements)
    out = np.full_like(x, np.nan)
    assert engine_test.meet(x, out, _orders(rng, ranks, runs, in_flight, how), in_flight, PATHS[path]) == []
    _check(x, out)


def test_a_rank_that_never_comes_is_named_with_its_latest_call_and_other_executions_go_on():
    rng = np.random.default_rng(4)
    ranks, runs = 4, 6
    x = _inputs(rng, runs, 1, ranks, 257)
    out = np.full_like(x, np.nan)
    orders = [list(range(runs)) for _ in range(ranks)]
    orders[2].remove(3)  # rank 2 skips run 3, as a program whose device 2 took another branch
    errors = engine_test.meet(x, out, orders, 2, PATHS["push"], timeout_ms=1000)
    assert len(errors) == ranks - 1, errors
    for error in errors:
        assert "run 3:" in error and "timed out waiting for rank(s) [2] that never arrived (rank 2's latest call of this op was in execution" in error
        assert "in execution 1003 (call 1 of this op there)" in error
    others = [r for r in range(runs) if r != 3]
    _check(x[others], out[others])


def test_xla_starts_one_launch_at_a_time():
    """What the engine no longer depends on, measured: XLA's CPU client starts a
    multi-device launch only when every device finished the one before it, so
    with this jaxlib queued executions never overlap. If this starts failing, XLA
    overlaps launches, which the tests above play."""
    events, lock = [], threading.Lock()

    def record(tag, step, device):
        with lock:
            events.append((time.perf_counter(), tag, int(step), int(device)))
        return np.int32(0)

    @functools.partial(jax.pmap, axis_name="i", devices=jax.devices()[:2])
    def program(x, step):
        device = jax.lax.axis_index("i")
        started = io_callback(functools.partial(record, "start"), jax.ShapeDtypeStruct((), jnp.int32), step, device)
        y = x + started
        # device 0 works longer, so device 1 would run ahead if launches overlapped
        y = jax.lax.cond(device == 0, lambda v: jax.lax.fori_loop(0, 50, lambda i, a: jnp.sin(a), v), lambda v: v, y)
        ended = io_callback(functools.partial(record, "end"), jax.ShapeDtypeStruct((), jnp.int32),
                            step + (jnp.sum(y) * 0).astype(jnp.int32), device)
        return y + ended

    x = jnp.ones((2, 20000))
    jax.block_until_ready([program(x, jnp.full((2,), k, jnp.int32)) for k in range(6)])
    events.sort()
    for k in range(1, 6):
        first_start = min(t for t, tag, step, _ in events if tag == "start" and step == k)
        last_end_before = max(t for t, tag, step, _ in events if tag == "end" and step == k - 1)
        assert first_start > last_end_before, f"launch {k} started before launch {k - 1} ended"


@pytest.mark.parametrize("path", ["push", "ring", "one_shot"])
def test_a_rank_that_comes_after_the_others_gave_up_touches_none_of_their_buffers(path):
    """The others time out and return (XLA then frees their buffers); the late rank
    must fail without writing into them, where the push path would write its chunk
    into every output (heap corruption under XLA, seen with 8 host devices)."""
    rng = np.random.default_rng(5)
    ranks, runs = 4, 3
    x = _inputs(rng, runs, 1, ranks, 4099)
    out = np.full_like(x, np.nan)
    errors = engine_test.meet(x, out, [list(range(runs))] * ranks, 1, PATHS[path], timeout_ms=150, late_rank=2)
    assert len(errors) == runs * ranks, errors
    assert all("rank(s) [2] that never arrived" in e for e in errors), errors
    assert np.isnan(out[:, :, 2]).all(), "the late rank ran its part of a call that had failed"
    if path != "ring":  # the ring's ranks write their own outputs stage by stage before they give up
        assert np.isnan(out).all(), "a rank wrote into the buffers of a call that had failed"
