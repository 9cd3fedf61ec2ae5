"""The one owner of the wait limit: argument checks, $JAXRING_TIMEOUT_S, set_default_timeout reaching the rings."""

import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import jaxring
from jaxring.collectives import _ffi, timeout


@pytest.fixture
def fresh_default(monkeypatch):
    """As if no collective had read the default yet; the previous default comes back afterwards."""
    previous = jaxring.default_timeout()
    monkeypatch.setattr(timeout, "_default_s", None)
    yield
    jaxring.set_default_timeout(previous)


@pytest.mark.parametrize("seconds", [3, 0.25, np.float32(2.5), math.inf])
def test_any_positive_real_is_a_timeout(seconds):
    assert timeout.check(seconds) == float(seconds)


@pytest.mark.parametrize(
    "seconds, error",
    [("5", TypeError), (None, TypeError), (True, TypeError), (0, ValueError), (-1.5, ValueError), (math.nan, ValueError)],
)
def test_anything_else_is_refused_with_what_was_given(seconds, error):
    with pytest.raises(error, match=f"positive number of seconds.*{seconds!r}"):
        timeout.check(seconds)


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan"])
def test_a_bad_environment_value_is_an_error_naming_the_variable(fresh_default, monkeypatch, value):
    monkeypatch.setenv(timeout.ENV, value)
    with pytest.raises(ValueError, match=f"JAXRING_TIMEOUT_S must be a positive number.*{value!r}"):
        jaxring.default_timeout()
    with pytest.raises(ValueError, match="JAXRING_TIMEOUT_S"):
        jax.pmap(lambda v: jaxring.allreduce(v, "i"), "i", devices=jax.devices()[:2])(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("value, seconds", [("", 300.0), ("12.5", 12.5), ("0.5", 0.5), ("inf", math.inf)])
def test_the_environment_value_reaches_the_handlers(fresh_default, monkeypatch, value, seconds):
    monkeypatch.setenv(timeout.ENV, value)
    assert jaxring.default_timeout() == seconds
    assert _ffi.cpu_module().default_timeout_s() == seconds


def test_set_default_timeout_governs_compiled_rings_and_cross_process_waits():
    previous = jaxring.default_timeout()

    def skip_on_rank_one(v):
        return jax.lax.cond(jax.lax.axis_index("i") == 1, lambda a: a, lambda a: jaxring.allreduce(a, "i"), v)

    program = jax.pmap(skip_on_rank_one, "i", devices=jax.devices()[:2])
    try:
        jaxring.set_default_timeout(0.5)
        assert timeout.resolve(None) == 0.5  # what agreement, broadcast and the replica checks wait
        with pytest.raises(Exception, match=r"rank\(s\) \[1\] that never arrived"):
            np.asarray(program(np.ones((2, 3), np.float32)))
    finally:
        jaxring.set_default_timeout(previous)


def test_an_infinite_timeout_waits_without_limit():
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    out = jax.pmap(lambda v: jaxring.allreduce(v, "i", timeout=math.inf), "i", devices=jax.devices()[:3])(x)
    np.testing.assert_allclose(out[2], x.astype(np.float64).sum(0), rtol=1e-5)
    with pytest.raises(TypeError, match="positive number of seconds"):
        jax.pmap(lambda v: jaxring.allreduce(v, "i", timeout="5"), "i", devices=jax.devices()[:3])(x)


def test_a_handler_module_added_later_gets_the_default_now_and_at_every_change(monkeypatch):
    class Handlers:  # what the MPI leg's compiled module offers (jaxring/collectives/mpi.py)
        def set_default_timeout_s(self, seconds):
            self.seen.append(seconds)

    handlers = Handlers()
    handlers.seen = []
    monkeypatch.setattr(timeout, "_other_modules", [])  # the fake leaves with this test
    previous = jaxring.default_timeout()
    try:
        timeout.add_handler_module(handlers)
        jaxring.set_default_timeout(7.5)
        assert handlers.seen == [previous, 7.5]
    finally:
        jaxring.set_default_timeout(previous)


def test_a_runtime_error_is_said_once_without_xlas_repeated_dispatch_prefixes():
    from jaxring.collectives.timeout import runtime_error_text

    queued = "INTERNAL: " + "Error dispatching computation: " * 45 + "jaxring collective (op id 1): timed out"
    assert runtime_error_text(RuntimeError(queued)) == "INTERNAL: jaxring collective (op id 1): timed out"


QUEUED_LOOP_WITH_A_MISSING_PEER = """
import jax, numpy as np, jaxring
def step(v):
    skip = jax.lax.axis_index("i") == 1  # rank 1 never calls the all-reduce
    return jax.lax.cond(skip, lambda a: a + 1, lambda a: jaxring.allreduce(a, "i", timeout=0.3) + 1, v)
values = np.random.default_rng(7).standard_normal((2, 1001)).astype(np.float32)
program = jax.pmap(step, "i")
for _ in range(40):  # queued, as a library user's loop queues its steps; the failure chains through all of them
    values = program(values)
values.block_until_ready()
"""


def test_a_timeout_under_queued_steps_reaches_a_library_loop_as_one_short_error():
    """XLA repeats 'Error dispatching computation: ' once per execution queued behind the one that
    failed (39 times here, 394 in issue 48's loop); the uncaught error shows jaxring's message once."""
    env = {k: v for k, v in os.environ.items() if k != "NPROC"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run([sys.executable, "-c", QUEUED_LOOP_WITH_A_MISSING_PEER], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert re.match(r"jax.errors.JaxRuntimeError: (INTERNAL: )?jaxring collective: op 1 ", last_line), last_line
    assert "Error dispatching computation" not in done.stderr
    assert "rank 0 of 2" in last_line and "timed out waiting for rank(s) [1]" in last_line
    assert "rank 1 never called this op" in last_line and "NPROC" in last_line
    assert len(last_line) < 1000, len(last_line)
