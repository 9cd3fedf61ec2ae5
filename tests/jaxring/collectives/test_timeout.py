"""The one owner of the wait limit: argument checks, $JAXRING_TIMEOUT_S, set_default_timeout reaching the rings."""

import math

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
    from jaxring.collectives.abort import runtime_error_text

    queued = "INTERNAL: " + "Error dispatching computation: " * 45 + "jaxring collective (op id 1): timed out"
    assert runtime_error_text(RuntimeError(queued)) == "INTERNAL: jaxring collective (op id 1): timed out"
