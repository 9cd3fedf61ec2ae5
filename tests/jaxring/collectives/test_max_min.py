"""allreduce(op="max"/"min") against lax.pmax/pmin: bits with NaNs and signed zeros mixed in on
each CPU engine path, the reduce_scatter kind reducing by max (what the MPI leg runs locally),
lax's refusals (complex numbers, differentiation), shard_map's types and queued steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxring
from jaxring.collectives import ring_primitive as ring
from jaxring.collectives.kinds import REDUCE_SCATTER
from tests.jaxring.collectives.test_cpu_engine import path  # noqa: F401 (the fixture that forces a path)
from tests.jaxring.collectives.test_dtypes import random_values, same_bits

LAX = {"max": jax.lax.pmax, "min": jax.lax.pmin}


def pmapped(fn, ranks):
    return jax.pmap(fn, axis_name="i", devices=jax.devices()[:ranks])


def specials_heavy(rng, shape, dtype):
    """Mostly NaN, -0.0 and +0.0: columns of all NaN, and of zeros of both signs only, occur often."""
    x = rng.choice(np.array([np.nan, -np.nan, 0.0, -0.0, 1.0, -1.0]), size=shape, p=[0.3, 0.1, 0.25, 0.25, 0.05, 0.05])
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16", "float64"))
@pytest.mark.parametrize("name", ("push", "one_shot"))
def test_nans_and_signed_zeros_are_lax_s_bits(path, name, dtype):  # noqa: F811 (path is the fixture)
    path(name)
    rng = np.random.default_rng(len(name))
    with jax.enable_x64(True):
        for ranks in (2, 5):
            x = specials_heavy(rng, (ranks, 1001), dtype)
            mine = pmapped(lambda v: (jaxring.allreduce(v, "i", op="max"), jaxring.allreduce(v, "i", op="min")),
                           ranks)(x)
            lax = pmapped(lambda v: (jax.lax.pmax(v, "i"), jax.lax.pmin(v, "i")), ranks)(x)
            for a, b in zip(mine, lax):
                assert same_bits(a, b)


@pytest.mark.parametrize("op", ("max", "min"))
def test_the_ring_path_gives_lax_s_values_and_may_differ_only_in_the_sign_of_a_zero(path, op):  # noqa: F811
    """The ring reduces chunk c starting after rank c, not at rank 0: a tie of -0.0 and +0.0 may go to
    the other zero (csrc/core/reduction.h); NaNs are skipped and every other bit is lax's."""
    path("ring")
    x = specials_heavy(np.random.default_rng(7), (4, 2003), np.float32)
    x[:, ::3] = random_values(np.random.default_rng(8), (4, 668), np.float32)
    mine = np.asarray(pmapped(lambda v: jaxring.allreduce(v, "i", op=op), 4)(x))
    lax = np.asarray(pmapped(lambda v: LAX[op](v, "i"), 4)(x))
    zero = lax == 0
    assert same_bits(mine[:, ~zero[0]], lax[:, ~zero[0]])
    assert (mine[:, zero[0]] == 0).all()
    assert same_bits(mine, np.broadcast_to(mine[0], mine.shape)), "replicas differ"


@pytest.mark.parametrize("op", ("max", "min"))
@pytest.mark.parametrize("dtype", ("float32", "int8", "uint32", "bool"))
def test_the_reduce_scatter_kind_reduces_by_max_and_min(op, dtype):
    """What the MPI engineer's local leg runs: each device gets its block of lax.pmax's result."""
    ranks, block = 3, 7
    x = random_values(np.random.default_rng(3), (ranks, ranks * block), dtype)
    mine = pmapped(lambda v: ring.bind(v, kind=REDUCE_SCATTER, names=("i",), timeout_ms=0, reduction=op), ranks)(x)
    full = np.asarray(pmapped(lambda v: LAX[op](v, "i"), ranks)(x))[0]
    for r in range(ranks):
        assert same_bits(mine[r], full[r * block:(r + 1) * block])


def test_complex_numbers_are_refused_at_trace_time_as_lax_refuses_them():
    x = np.ones((2, 3), np.complex64)
    for op in ("max", "min"):
        with pytest.raises(Exception, match="Unsupported reduction computation"):
            np.asarray(pmapped(lambda v: LAX[op](v, "i"), 2)(x))
        with pytest.raises(TypeError, match=rf"allreduce\(op='{op}'\) of complex64: complex numbers have no order"):
            jax.make_jaxpr(pmapped(lambda v: jaxring.allreduce(v, "i", op=op), 2))(x)


@pytest.mark.parametrize("op", ("max", "min"))
def test_no_derivative_as_lax_has_none(op):
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    for reduce, what in ((lambda v: LAX[op](v, "i"), f"'p{op}'"),
                         (lambda v: jaxring.allreduce(v, "i", op=op), f"jaxring.allreduce\\(op='{op}'\\)")):
        with pytest.raises(NotImplementedError, match=f"Differentiation rule for {what}.*not implemented"):
            pmapped(jax.grad(lambda v: reduce(v).sum()), 2)(x)
        with pytest.raises(NotImplementedError, match=f"Transpose rule.*for {what}.*not implemented"):
            pmapped(lambda v: jax.linear_transpose(reduce, v)(v), 2)(x)
    # A max that no derivative flows through is fine, as lax's.
    out = pmapped(jax.grad(lambda v: (v * jaxring.allreduce(jax.lax.stop_gradient(v), "i", op=op)).sum()), 2)(x)
    np.testing.assert_array_equal(out, np.broadcast_to(getattr(np, op)(x, 0), x.shape))


@pytest.mark.parametrize("check_vma", (True, False))
def test_shard_map_types_the_result_as_lax_pmax(check_vma):
    mesh = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4])
    spec = jax.sharding.PartitionSpec(("a", "b"))
    x = jax.device_put(random_values(np.random.default_rng(2), (4 * 5,), np.float32),
                       jax.sharding.NamedSharding(mesh, spec))

    def program(reduce):
        return jax.jit(jax.shard_map(lambda v: reduce(v), mesh=mesh, in_specs=spec,
                                     out_specs=jax.sharding.PartitionSpec("a"), check_vma=check_vma))

    for op in ("max", "min"):
        mine = program(lambda v: jaxring.allreduce(v, "b", op=op))(x)
        lax = program(lambda v: LAX[op](v, "b"))(x)
        assert same_bits(mine, lax)
        assert jax.typeof(mine) == jax.typeof(lax)


@pytest.mark.parametrize("dtype", ("float32", "float64", "int16"))
def test_queued_steps_of_changing_values(dtype):
    """Steps queued without a block, each step's values the last one's output and its own input:
    a max and a min of every step, and a sum (wrapping, for int16) against a numpy replay in rank order."""
    ranks, steps, size = 3, 10, 101
    with jax.enable_x64(True):
        inputs = random_values(np.random.default_rng(9), (steps, ranks, size), dtype)
        if dtype != "int16":
            # numpy breaks ties of -0.0 and +0.0 its own way: no zeros (test_nans_and_signed_zeros checks them)
            inputs = np.where(np.isfinite(inputs) & (inputs != 0), inputs, 0.5).astype(dtype) / 64
        step = pmapped(lambda w, x: (jaxring.allreduce(jnp.maximum(w, x), "i", op="max"),
                                     jaxring.allreduce(w - x, "i", op="min"), jaxring.allreduce(x * w, "i")), ranks)
        w = np.ones((ranks, size), dtype)
        queued = []
        for k in range(steps):
            high, low, w = step(w, inputs[k])
            queued.append((high, low))
        expected_w = np.ones(size, dtype)
        for k in range(steps):
            high, low = queued[k]
            assert same_bits(np.asarray(high)[0], np.maximum(expected_w, inputs[k]).max(0))
            assert same_bits(np.asarray(low)[0], (expected_w - inputs[k]).min(0))
            products = inputs[k] * expected_w
            expected_w = products[0]
            for row in products[1:]:
                expected_w = expected_w + row  # rank order, wrapping for int16
        assert same_bits(np.asarray(w)[0], expected_w)


@pytest.mark.parametrize("dtype, reduction, error", (
    ("complex64", "max", "jaxring: max of complex64: complex numbers have no order"),
    ("bool", "sum", "jaxring: a sum of bool; sum them as int32"),
))
def test_the_handler_refuses_what_ring_py_refuses_first(dtype, reduction, error):
    """The handlers' own refusal (csrc/core/ring_handler_common.h), for a primitive bound past the ops' checks (arguments.py)."""
    x = np.ones((2, 4), dtype)
    with pytest.raises(Exception, match=error):
        np.asarray(pmapped(lambda v: ring.bind(v, kind=ring.ALLREDUCE, names=("i",), timeout_ms=0,
                                                reduction=reduction), 2)(x))
