"""Reduced and unreduced values (explicit sharding), against lax: all_gather(to="reduced") and sums of an
unreduced value (lax's all_gather_reduced, unreduced_psum and unreduced_psum_scatter). The same values,
types and shardings, the same gradients, with jaxring's ring running every collective of the program
and of its gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

from jaxring.collectives import ring_primitive as ring
from tests.jaxring.collectives.random_inputs import random_array
from tests.jaxring.collectives.test_lax_parity import Lax, Ring

# lax's primitives for these ops: none may be left in a program of jaxring's (its no-op casts may).
LAX_COLLECTIVES = ("all_gather_reduced", "unreduced_psum", "unreduced_reduce_scatter", "psum", "all_gather[")


@pytest.fixture
def mesh():
    mesh = jax.make_mesh((2, 3), ("data", "seq"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:6])
    with jax.set_mesh(mesh):
        yield mesh


def by_both(program, *args, lax_s_own=()):
    """program(ops)(*args) and the gradient of the sum of its sines, under jit, for lax's ops and
    jaxring's: [(lax's, jaxring's) of the result, then of each argument's gradient]. Checks that
    jaxring's programs (value and gradient) run only jaxring's collectives, but `lax_s_own`: those
    the transposes of the program's own lax casts run."""
    outs = {}
    for ops in (Lax, Ring):
        def loss(*a, ops=ops):
            return jnp.sin(program(ops)(*a)).sum()

        value, grads = jax.jit(program(ops))(*args), jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
        outs[ops] = (value, *grads)
        if ops is Ring:
            text = str(jax.make_jaxpr(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(*args))
            assert ring.ring_p.name in text and not any(op in text for op in LAX_COLLECTIVES if op not in lax_s_own), text
    return list(zip(outs[Lax], outs[Ring]))


def assert_same(pairs, rtol=1e-5):
    for want, got in pairs:
        assert jax.typeof(got) == jax.typeof(want), (jax.typeof(got), jax.typeof(want))
        assert got.sharding == want.sharding, (got.sharding, want.sharding)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=rtol)


def typed_as(ops, seen, out):
    seen[ops] = jax.typeof(out).mat
    return out


@pytest.mark.parametrize("tiled, axis", [(True, 0), (True, 1), (False, 0), (False, 2)])
def test_all_gather_to_reduced_is_lax_s_and_its_gradient_a_reduce_scatter(mesh, tiled, axis):
    x = jax.device_put(random_array(np.random.default_rng(1), (2 * 5, 3 * 7), jnp.float32), P("data", "seq"))
    seen = {}

    def program(ops):
        return jax.shard_map(lambda block: typed_as(ops, seen, ops.all_gather(block, "seq", axis=axis, tiled=tiled,
                                                                             to="reduced")),
                             out_specs=P("data", reduced={"seq"}))

    pairs = by_both(program, x)
    assert seen[Ring] == seen[Lax] and seen[Ring].reduced == {"seq"} and seen[Ring].varying == {"data"}
    assert_same(pairs)
    # Each element is gathered once: its gradient is cos(x), its own, whatever the layout.
    np.testing.assert_allclose(np.asarray(pairs[1][1]), np.cos(np.asarray(x)), rtol=1e-6)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_a_sum_of_an_unreduced_value_is_lax_s_unreduced_psum(mesh, op):
    x = jax.device_put(random_array(np.random.default_rng(2), (2 * 4, 3 * 5), jnp.float32), P("data", "seq"))
    seen = {}

    def program(ops):
        def body(block):  # each device's block as its part of a sum over "seq"
            parts = jax.lax.pcast(block, "seq", to="unreduced")
            return typed_as(ops, seen, ops.allreduce(parts, "seq", op))

        return jax.shard_map(body, out_specs=P("data"))

    pairs = by_both(program, x)
    assert seen[Ring] == seen[Lax] and not seen[Ring].unreduced and seen[Ring].varying == {"data"}
    assert_same(pairs)
    blocks = np.asarray(x, np.float64).reshape(8, 3, 5)
    want = blocks.sum(1) / (3 if op == "mean" else 1)
    np.testing.assert_allclose(np.asarray(pairs[0][1]), want, rtol=1e-5)


@pytest.mark.parametrize("tiled, dimension", [(True, 1), (False, 0)])
def test_a_scatter_of_an_unreduced_value_is_lax_s_unreduced_psum_scatter(mesh, tiled, dimension):
    x = jax.device_put(random_array(np.random.default_rng(3), (2 * 3, 3 * 9), jnp.float32), P("data", "seq"))
    seen = {}

    def program(ops):
        def body(block):  # [3, 9]: dimension 1 tiled into 3 blocks of 3, or dimension 0 one row per device
            parts = jax.lax.pcast(block, "seq", to="unreduced")
            return typed_as(ops, seen, ops.reduce_scatter(parts, "seq", scatter_dimension=dimension, tiled=tiled))

        return jax.shard_map(body, out_specs=P("data", "seq") if tiled else P(("data", "seq")))

    pairs = by_both(program, x)
    assert seen[Ring] == seen[Lax] and not seen[Ring].unreduced and seen[Ring].varying == {"data", "seq"}
    assert_same(pairs)


def whole_weights(ops, w):
    """FSDP's weights: `w` sharded over "seq" typed reduced over "data" (lax's no-op cast), then all-gathered
    to reduced over "seq" by `ops`, whole on every device for a computation outside shard_map."""
    as_reduced = jax.shard_map(lambda a: jax.lax.pcast(a, "data", to="reduced"), in_specs=P("seq", None),
                               out_specs=P("seq", None, reduced={"data"}))
    gathered = jax.shard_map(lambda a: ops.all_gather(a, "seq", tiled=True, to="reduced"),
                             in_specs=P("seq", None, reduced={"data"}), out_specs=P(None, None, reduced={"seq", "data"}))
    return gathered(as_reduced(w))


def test_fsdp_weights_gathered_reduced_train_as_on_one_device(mesh):
    """Weights sharded over "seq", typed reduced over "data" (lax's no-op cast), all-gathered to reduced
    over "seq" and used outside shard_map: the weights' gradient comes back through the ring's
    reduce-scatter, then the sum over "data" that lax's cast transposes to (its unreduced_psum). Values
    and gradients as lax's and as float64 numpy's on the whole arrays."""
    rng = np.random.default_rng(4)
    x_np, w_np = random_array(rng, (4, 6, 5), jnp.float32), random_array(rng, (6, 4), jnp.float32)
    x, w = jax.device_put(x_np, P("data", "seq", None)), jax.device_put(w_np, P("seq", None))

    def program(ops):
        return lambda x, w: jnp.einsum("btd,df->btf", x[..., :5] @ np.ones((5, 6), np.float32), whole_weights(ops, w))

    pairs = by_both(program, x, w, lax_s_own=("unreduced_psum", "psum"))
    assert_same(pairs, rtol=1e-4)
    # d/dw and d/dx of sum(sin(h @ w)), h = x @ ones: float64 numpy on the whole arrays.
    h = np.asarray(x_np, np.float64) @ np.ones((5, 6))
    upstream = np.cos(h @ np.asarray(w_np, np.float64))
    np.testing.assert_allclose(np.asarray(pairs[2][1]), np.einsum("btd,btf->df", h, upstream), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(pairs[1][1]), (upstream @ np.asarray(w_np, np.float64).T) @ np.ones((6, 5)),
                               rtol=1e-4, atol=1e-4)


def test_fsdp_training_steps_queued_are_lax_s(mesh):
    """Eight SGD steps of the FSDP layer above, queued before any is read, the data changing per step:
    the weights after each step as lax's trains them."""
    rng = np.random.default_rng(6)
    xs = [jax.device_put(random_array(rng, (4, 6, 6), jnp.float32), P("data", "seq", None)) for _ in range(8)]
    w0 = jax.device_put(random_array(rng, (6, 4), jnp.float32) / 4, P("seq", None))

    def trained(ops):
        @jax.jit
        def step(w, x):
            loss = lambda w: jnp.mean(jnp.tanh(jnp.einsum("btd,df->btf", x, whole_weights(ops, w))) ** 2)  # noqa: E731
            return w - 0.5 * jax.grad(loss)(w)

        weights, w = [], w0
        for x in xs:
            w = step(w, x)
            weights.append(w)
        return weights

    for want, got in zip(trained(Lax), trained(Ring), strict=True):
        assert got.sharding == want.sharding
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(got), np.asarray(w0))


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_of_an_unreduced_value_are_refused_as_by_lax(mesh, op):
    x = jax.device_put(random_array(np.random.default_rng(5), (2 * 2, 3 * 2), jnp.float32), P("data", "seq"))
    errors = []
    for ops in (Lax, Ring):
        body = lambda block, ops=ops: ops.allreduce(jax.lax.pcast(block, "seq", to="unreduced"), "seq", op)  # noqa: E731
        with pytest.raises(ValueError) as refusal:
            jax.jit(jax.shard_map(body, out_specs=P("data")))(x)
        errors.append(str(refusal.value))
    assert "unreduced" in errors[0] and "unreduced" in errors[1], errors
