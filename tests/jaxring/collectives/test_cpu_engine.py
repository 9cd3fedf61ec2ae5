"""The CPU engine (csrc/cpu/cpu_engine.cc): both of its paths against jax.lax and
float64 numpy, the size at which it switches, and what happens after a failure."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxring
from jaxring.collectives import _ffi
from tests.jaxring.collectives.random_inputs import random_array
from tests.testing_modules import built_test_module

_jaxring_protocol = built_test_module("jaxring.collectives._jaxring_protocol")

MODULE = _ffi.cpu_module()
PATHS = ("ring", "one_shot", "push")
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)


@pytest.fixture
def path():
    """Restores the engine's path and threshold, whatever the test set."""
    previous = MODULE.cpu_path(), MODULE.cpu_push_max_bytes()
    yield lambda name: MODULE.set_cpu_path(MODULE.CPU_PATHS[name])
    MODULE.set_cpu_path(previous[0])
    MODULE.set_cpu_push_max_bytes(previous[1])


def pmapped(fn, ranks):
    return jax.pmap(fn, axis_name="i", devices=jax.devices()[:ranks])


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and (a.view(np.uint8) == b.view(np.uint8)).all()


def rank_order_sum(x):
    """The one-shot path's arithmetic: each element summed in rank order in the
    accumulation type (float32 for 16-bit floats), rounded once."""
    x = np.asarray(x)
    acc = np.int32 if x.dtype == np.int32 else np.float32
    total = x[0].astype(acc)
    for row in x[1:]:
        total = total + row.astype(acc)
    return total.astype(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ranks", (2, 3, 5, 8))
@pytest.mark.parametrize("name", PATHS)
def test_each_path_reduces_scatters_and_gathers_as_lax_does(path, name, ranks, dtype):
    path(name)
    rng = np.random.default_rng(ranks * 31 + len(name))
    for elements in (1, ranks - 1, 37 * ranks, 20011):
        x = random_array(rng, (ranks, elements * ranks), dtype)
        mine = pmapped(lambda v: (jaxring.allreduce(v, "i"), jaxring.reduce_scatter(v, "i", tiled=True),
                                  jaxring.all_gather(v, "i", tiled=True)), ranks)(x)
        lax = pmapped(lambda v: (jax.lax.psum(v, "i"), jax.lax.psum_scatter(v, "i", tiled=True),
                                 jax.lax.all_gather(v, "i", tiled=True)), ranks)(x)
        total = np.asarray(x, np.float64).sum(0)
        for r in range(ranks):
            assert same_bits(mine[0][r], mine[0][0]), "replicas differ"
            assert same_bits(mine[2][r], lax[2][r]), "all_gather moves bits, it must not change them"
        if dtype == jnp.int32:
            assert same_bits(mine[0], lax[0]) and same_bits(mine[1], lax[1])
        else:
            scale = np.abs(total).max()
            eps = {jnp.float32: 2e-7 * ranks, jnp.bfloat16: 2.0**-8, jnp.float16: 2.0**-11}[dtype]
            np.testing.assert_allclose(np.asarray(mine[0][0], np.float64), total, atol=2 * eps * scale)
            chunks = np.asarray(mine[1], np.float64).reshape(-1)
            np.testing.assert_allclose(chunks, total, atol=2 * eps * scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ("one_shot", "push"))
def test_one_shot_and_push_sum_in_rank_order_and_round_once(path, name, dtype):
    path(name)
    x = random_array(np.random.default_rng(3), (5, 1003), dtype)
    out, chunks = pmapped(lambda v: (jaxring.allreduce(v, "i"),
                                     jaxring.reduce_scatter(jnp.pad(v, (0, 2)), "i", tiled=True)), 5)(x)
    expected = rank_order_sum(x)
    for r in range(5):
        assert same_bits(out[r], expected)
        assert same_bits(chunks[r], np.pad(expected, (0, 2))[r * 201 : (r + 1) * 201])


def test_auto_takes_the_push_path_up_to_the_threshold_and_the_ring_above(path):
    ranks = 4
    threshold = 4096
    rng = np.random.default_rng(11)
    results = {}
    for elements in (threshold // 4, threshold // 4 + 4):
        x = random_array(rng, (ranks, elements), jnp.float32) * 1e3  # sums whose order shows in the bits
        program = pmapped(lambda v: jaxring.allreduce(v, "i"), ranks)
        for name in ("auto", *PATHS):
            path(name)
            MODULE.set_cpu_push_max_bytes(threshold)
            results[elements, name] = np.asarray(program(x))
        assert not same_bits(results[elements, "ring"], results[elements, "push"]), "pick inputs whose paths differ"
    assert same_bits(results[threshold // 4, "auto"], results[threshold // 4, "push"])
    assert same_bits(results[threshold // 4 + 4, "auto"], results[threshold // 4 + 4, "ring"])


def test_by_default_every_size_takes_the_push_path(path):
    path("auto")
    assert MODULE.cpu_push_max_bytes() >= 1 << 40


def in_place_calls(program, x):
    """Whether each jaxring custom call of the lowered program writes its output over its input."""
    hlo = program.lower(x).as_text()
    return [("output_operand_aliases" in line) for line in hlo.splitlines() if "custom_call @jaxring_ring" in line]


def test_allreduces_of_computed_values_on_rings_the_push_path_serves_write_over_their_input():
    modes = _ffi.cpu_module().MODES
    assert MODULE.runs_in_place(modes["allreduce"], _jaxring_protocol.MAX_RANKS)
    assert not MODULE.runs_in_place(modes["allreduce"], _jaxring_protocol.MAX_RANKS + 1)
    assert not MODULE.runs_in_place(modes["reduce_scatter"], 4)
    assert not MODULE.runs_in_place(modes["all_gather"], 4)
    x = random_array(np.random.default_rng(12), (4, 64), jnp.float32)
    computed = pmapped(lambda v: (jaxring.allreduce(v * 2, "i"), jaxring.reduce_scatter(v * 2, "i", tiled=True)), 4)
    assert in_place_calls(computed, x) == [True, False]
    # the program's own input (XLA would copy it first), also reshaped, and a captured constant: not in place
    constant = np.ones(64, np.float32)
    inputs = pmapped(lambda v: (jaxring.allreduce(v, "i"), jaxring.allreduce(v.reshape(8, 8), "i"),
                                jaxring.allreduce(jnp.asarray(constant) + 0 * v, "i"),
                                jaxring.allreduce(jnp.asarray(constant), "i")), 4)
    assert in_place_calls(inputs, x) == [False, False, True, False]
    chained = pmapped(lambda v: jaxring.allreduce(jaxring.allreduce(v, "i"), "i"), 4)
    assert in_place_calls(chained, x) == [False, True]
    fused = pmapped(lambda v: jaxring.tree_allreduce({"a": v, "b": v * 2}, "i", op="mean", bucket_bytes=1 << 20), 4)
    assert in_place_calls(fused, x) == [True]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", PATHS)
def test_in_place_allreduces_leave_a_live_input_whole_and_chain(path, name, dtype):
    """A computed input still used after the op (XLA copies it first) and a chain of ops, each
    summing the last one's output in place, on every path (ring and one-shot read a copy)."""
    path(name)
    ranks = 5
    x = random_array(np.random.default_rng(13), (ranks, 4099), dtype)

    def program(v):
        doubled = v * 2  # exact in every dtype here
        halve = (lambda a: a // 2) if dtype == jnp.int32 else (lambda a: a * 0.5)
        once = jaxring.allreduce(doubled, "i")
        return jaxring.allreduce(halve(once), "i"), doubled, halve(once)

    assert in_place_calls(pmapped(program, ranks), x) == [True, True]
    twice, kept, once = pmapped(program, ranks)(x)
    assert same_bits(kept, np.asarray(x) * 2), "the op wrote over an input the program still uses"
    total = np.asarray(x, np.float64).sum(0)
    if dtype == jnp.int32:
        assert same_bits(once[0], total.astype(np.int32)) and (np.asarray(twice[0]) == ranks * total).all()
    else:
        eps = {jnp.float32: 2e-7 * ranks, jnp.bfloat16: 2.0**-8, jnp.float16: 2.0**-11}[dtype]
        scale = np.abs(total).max()
        np.testing.assert_allclose(np.asarray(once[0], np.float64), total, atol=2 * eps * scale)
        np.testing.assert_allclose(np.asarray(twice[0], np.float64), ranks * np.asarray(once[0], np.float64),
                                   atol=2 * eps * ranks * scale)
    for r in range(ranks):
        assert same_bits(twice[r], twice[0]) and same_bits(once[r], once[0]), "replicas differ"


def test_set_cpu_path_refuses_an_unknown_path():
    with pytest.raises(ValueError, match="CPU_PATHS"):
        MODULE.set_cpu_path(7)


@pytest.mark.parametrize("name", PATHS)
def test_many_executions_in_flight_each_meet_their_own_peers(path, name):
    """Dispatched without waiting, a fast device runs ahead into the next execution."""
    path(name)
    program = pmapped(lambda v: jaxring.allreduce(v * 2, "i") + v, 8)
    x = random_array(np.random.default_rng(5), (8, 3001), jnp.float32)
    outs = [program(x + k) for k in range(30)]
    for k, out in enumerate(outs):
        expected = 2 * np.asarray(x + k, np.float64).sum(0) + np.asarray(x + k, np.float64)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("name", PATHS)
def test_after_a_rank_never_arrives_the_next_execution_runs(path, name):
    path(name)
    x = random_array(np.random.default_rng(6), (4, 2000), jnp.float32)

    def skip_on(v, flag):
        absent = jax.lax.axis_index("i") == 2
        return jax.lax.cond(absent & flag, lambda a: a, lambda a: jaxring.allreduce(a, "i", timeout=0.5), v)

    program = jax.pmap(skip_on, axis_name="i", devices=jax.devices()[:4], in_axes=(0, None))
    with pytest.raises(Exception, match=r"rank\(s\) \[2\] that never arrived"):
        np.asarray(program(x, True))
    for _ in range(3):
        out = np.asarray(program(x, False))
        np.testing.assert_allclose(out[1], np.asarray(x, np.float64).sum(0), rtol=1e-5, atol=1e-4)


LATE_RANK = """
import time
import jax, jax.numpy as jnp, numpy as np, jaxring

x = (np.random.default_rng(8).standard_normal((4, 999)) + 0.1).astype(np.float32)

def late_on_two(v, late):
    pause = jnp.where((jax.lax.axis_index("i") == 2) & late, 3.0, 0.0)
    v = jax.pure_callback(lambda s, a: (time.sleep(float(s)), a)[1], jax.ShapeDtypeStruct(v.shape, v.dtype), pause, v)
    return jaxring.allreduce(v, "i", timeout=0.5)

program = jax.pmap(late_on_two, axis_name="i", devices=jax.devices()[:4], in_axes=(0, None))
try:
    np.asarray(program(x, True))
    print("the late execution succeeded")
except Exception as e:
    print("failed:", "rank(s) [2] that never arrived" in str(e))
for _ in range(3):
    out = np.asarray(program(x, False))
    np.testing.assert_allclose(out[3], x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)
print("next executions ok")
"""


def test_a_rank_late_for_a_failed_execution_fails_it_and_leaves_the_next_one_whole():
    """Rank 2 reaches the collective 3 s late, after the others gave up on it: the execution
    fails naming it, and the next executions run whole. In a process of its own: the callback
    that delays rank 2 keeps the failed execution's error in JAX's runtime tokens until exit."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", LATE_RANK], env=env, capture_output=True, text=True, timeout=300)
    assert "failed: True" in done.stdout and "next executions ok" in done.stdout, done.stdout + done.stderr[-3000:]


def test_more_ranks_than_the_one_shot_path_holds_take_the_ring():
    """The one-shot lane holds at most MAX_RANKS peers; a bigger ring of host devices runs the ring."""
    ranks = _jaxring_protocol.MAX_RANKS + 2
    code = f"""
import numpy as np, jax, jaxring
x = np.random.default_rng(0).standard_normal(({ranks}, 999)).astype(np.float32)
out = jax.pmap(lambda v: jaxring.allreduce(v, "i"), "i")(x)
assert (np.asarray(out).view(np.uint8) == np.asarray(out[:1]).view(np.uint8)).all()
np.testing.assert_allclose(out[0], x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)
print("ok")
"""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={ranks}", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
