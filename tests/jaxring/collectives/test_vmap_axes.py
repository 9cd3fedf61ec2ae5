"""jaxring's collectives over vmap axes, alone and with device axes, against jax.lax's.

Every case runs one function twice, once with lax's ops and once with jaxring's, and
compares values and dtypes (or both refusals): vmap inside pmap and shard_map, vmap of a
pmapped or shard_mapped function, a collective inside custom_vjp, a jaxpr traced before it
is vmapped, gradients. Odd sizes throughout: 3 devices, 5 batch elements, 7 values.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jaxring
from jaxring.collectives import arguments as ring, kinds, ring_primitive
from tests.jaxring.collectives.random_inputs import random_array
from tests.jaxring.collectives.test_lax_parity import Lax, Ring, assert_same

DEVICES, BATCH, VALUES = 3, 5, 7


def every_op(ops, v):
    """Each op over the vmap axis "j" alone and, where lax takes it, with the device axis "i"."""
    return (
        ops.allreduce(v, "j"),
        ops.allreduce(v, ("i", "j")),
        ops.allreduce(v, ("j", "i"), op="mean"),  # the mean divides by devices x batch
        ops.reduce_scatter(jnp.stack([v] * BATCH), "j"),
        ops.reduce_scatter(jnp.concatenate([v, v])[: 2 * BATCH], "j", tiled=True),
        ops.all_gather(v, "j", axis=1),
        ops.all_gather(v, "j", tiled=True),
    )


def assert_all_same(ring_outputs, lax_outputs, count):
    assert jax.tree.structure(ring_outputs) == jax.tree.structure(lax_outputs)
    for got, want in zip(jax.tree.leaves(ring_outputs), jax.tree.leaves(lax_outputs)):
        assert_same(np.asarray(got), np.asarray(want), count)


@pytest.mark.parametrize("dtype", (jnp.float32, jnp.int32), ids=("float32", "int32"))
def test_vmap_inside_pmap_matches_lax(dtype):
    x = random_array(np.random.default_rng(1), (DEVICES, BATCH, 2 * VALUES), dtype)

    def run(ops):
        return jax.pmap(jax.vmap(functools.partial(every_op, ops), axis_name="j"), "i",
                        devices=jax.devices()[:DEVICES])(x)

    assert_all_same(run(Ring), run(Lax), DEVICES * BATCH)


def test_vmap_over_a_trailing_dimension_and_of_a_constant_match_lax():
    x = random_array(np.random.default_rng(2), (DEVICES, 2 * VALUES, BATCH), jnp.float32)

    def body(ops, v, c):  # c: not batched, the same for every batch element
        return every_op(ops, v) + (ops.allreduce(c, ("i", "j")), ops.reduce_scatter(c, "j", tiled=True),
                                   ops.all_gather(c, "j"))

    def run(ops):
        return jax.pmap(jax.vmap(functools.partial(body, ops), in_axes=(1, None), axis_name="j"), "i",
                        devices=jax.devices()[:DEVICES])(x, x[:, :BATCH * 2, 0])

    assert_all_same(run(Ring), run(Lax), DEVICES * BATCH)


def test_vmap_of_pmap_reducing_over_both_axes_matches_lax():
    # The collective is traced inside pmap, and batched afterwards, when vmap batches pmap's jaxpr.
    x = random_array(np.random.default_rng(3), (BATCH, DEVICES, VALUES), jnp.float32)

    def body(ops, v):
        return ops.allreduce(v, ("i", "j")), ops.allreduce(v, "j", op="mean"), ops.all_gather(v, "j")

    def run(ops):
        return jax.vmap(jax.pmap(functools.partial(body, ops), "i", devices=jax.devices()[:DEVICES]), axis_name="j")(x)

    assert_all_same(run(Ring), run(Lax), DEVICES * BATCH)


UNDER_SHARD_MAP = {
    "sum over (i, j)": lambda ops, v: ops.allreduce(v, ("i", "j")),
    "mean over j": lambda ops, v: ops.allreduce(v, "j", "mean"),
    "all_gather over j": lambda ops, v: ops.all_gather(v, "j", axis=1),
    "reduce_scatter over j": lambda ops, v: ops.reduce_scatter(jnp.tile(v, (BATCH, 1))[:BATCH], "j"),
    "sum of a constant over (i, j)": lambda ops, v: ops.allreduce(jnp.ones(3), ("i", "j")),
}


@pytest.mark.parametrize("check_vma", (True, False), ids=("check_vma", "no_check_vma"))
@pytest.mark.parametrize("vmap_outside", (True, False), ids=("vmap_of_shard_map", "shard_map_of_vmap"))
def test_vmap_inside_and_outside_shard_map_matches_lax(vmap_outside, check_vma):
    # Typed (check_vma), lax refuses every collective over a vmap axis; so must jaxring.
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("i",))
    x = random_array(np.random.default_rng(4), (BATCH, DEVICES * 2, VALUES), jnp.float32)

    def run(ops, call):
        inner = functools.partial(call, ops)
        if vmap_outside:
            mapped = jax.vmap(jax.shard_map(inner, mesh=mesh, in_specs=P("i"), out_specs=P(), check_vma=check_vma),
                              axis_name="j")
        else:
            mapped = jax.shard_map(jax.vmap(inner, axis_name="j"), mesh=mesh, in_specs=P(None, "i"), out_specs=P(),
                                   check_vma=check_vma)
        try:
            return jax.jit(mapped)(x)
        except Exception as refused:  # noqa: BLE001 - compared by type with lax's
            return refused

    for call in UNDER_SHARD_MAP.values():
        ring_result, lax_result = run(Ring, call), run(Lax, call)
        if check_vma:
            assert type(ring_result) is type(lax_result) and isinstance(lax_result, Exception), (ring_result, lax_result)
            assert "check_vma" in str(ring_result)  # where lax's assertion says nothing, jaxring's says why
        else:
            assert_all_same(ring_result, lax_result, DEVICES * BATCH)


def test_custom_vjp_custom_jvp_and_a_traced_jaxpr_under_vmap_match_lax():
    x = random_array(np.random.default_rng(5), (DEVICES, BATCH, VALUES), jnp.float32)

    def with_custom_vjp(ops):
        @jax.custom_vjp
        def f(v):
            return ops.allreduce(v, ("i", "j"))

        f.defvjp(lambda v: (f(v), None), lambda _, g: (ops.allreduce(g, "j"),))
        return f

    def with_custom_jvp(ops):
        @jax.custom_jvp
        def f(v):
            return ops.allreduce(v, ("j", "i"), "mean")

        f.defjvp(lambda primals, tangents: (f(*primals), ops.allreduce(tangents[0], "j")))
        return f

    def body(ops, v):
        # A jaxpr traced with "j" bound, then vmapped by evaluating it under vmap.
        traced = jax.make_jaxpr(lambda u: ops.allreduce(u, ("j", "i")))(v)
        from_jaxpr = jax.core.eval_jaxpr(traced.jaxpr, traced.consts, v)[0]
        return (with_custom_vjp(ops)(v), jax.grad(lambda u: with_custom_vjp(ops)(u).sum())(v), from_jaxpr,
                with_custom_jvp(ops)(v), jax.jvp(with_custom_jvp(ops), (v,), (v * v,))[1])

    def run(ops):
        return jax.pmap(jax.vmap(functools.partial(body, ops), axis_name="j"), "i", devices=jax.devices()[:DEVICES])(x)

    assert_all_same(run(Ring), run(Lax), DEVICES * BATCH)


def test_grad_through_vmap_axes_matches_lax():
    x = random_array(np.random.default_rng(6), (DEVICES, BATCH, 2 * BATCH), jnp.float32)
    w = random_array(np.random.default_rng(7), (2 * BATCH,), jnp.float32)

    def loss(ops, v, w):
        summed = ops.allreduce(v * w, ("i", "j"), op="mean")
        scattered = ops.reduce_scatter(v * w, "j", tiled=True)
        gathered = ops.all_gather(scattered * w[:2], "j", tiled=True)
        return (summed**2).sum() + (gathered * v).sum()

    def run(ops):
        grads = jax.vmap(jax.grad(functools.partial(loss, ops), argnums=(0, 1)), in_axes=(0, None), axis_name="j")
        return jax.pmap(grads, "i", in_axes=(0, None), devices=jax.devices()[:DEVICES])(x, w)

    assert_all_same(run(Ring), run(Lax), DEVICES * BATCH)


def test_vmap_alone_matches_lax_without_any_device_map():
    x = random_array(np.random.default_rng(8), (BATCH, 2 * BATCH), jnp.float32)

    def body(ops, v):
        return (ops.allreduce(v, "j"), ops.allreduce(v, "j", op="mean"), ops.reduce_scatter(v, "j", tiled=True),
                ops.all_gather(v, "j"))

    def run(ops):
        return jax.jit(jax.vmap(functools.partial(body, ops), axis_name="j"))(x)

    assert_all_same(run(Ring), run(Lax), BATCH)
    booleans = x > 0
    counted = jax.vmap(lambda v: jaxring.allreduce(v, "j"), axis_name="j")(booleans)
    assert_all_same(counted, jax.vmap(lambda v: jax.lax.psum(v, "j"), axis_name="j")(booleans), BATCH)


@pytest.mark.parametrize("reduction", ("sum", "max", "min"))
def test_the_batch_reduction_follows_the_reduction(reduction):
    # ring_p's own reduction param; public op="max"/"min" are the dtypes engineer's (issue 45).
    x = random_array(np.random.default_rng(9), (BATCH, VALUES), jnp.float32)
    lax_op = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}[reduction]

    def bound(v):
        return ring_primitive.ring_p.bind(v, params=ring_primitive.RingParams(
            kind=kinds.ALLREDUCE, axis_name=("j",), ranks=BATCH, op_id=0, timeout_ms=0, reduction=reduction, groups=None))

    for in_axes in (0, None):
        got = jax.vmap(bound, in_axes=in_axes, axis_name="j", axis_size=BATCH)(x if in_axes == 0 else x[0])
        want = jax.vmap(lambda v: lax_op(v, "j"), in_axes=in_axes, axis_name="j", axis_size=BATCH)(
            x if in_axes == 0 else x[0])
        assert_all_same(got, want, BATCH)


REFUSED_OVER_VMAP_AXES = {
    "all_gather over a device and a vmap axis": lambda ops, v: ops.all_gather(v, ("i", "j")),
    "reduce_scatter over a device and a vmap axis": lambda ops, v: ops.reduce_scatter(v, ("i", "j"), tiled=True),
    "axis_index_groups over a vmap axis": lambda ops, v: ops.allreduce(v, "j", axis_index_groups=[[0, 1, 2, 3, 4]]),
}


@pytest.mark.parametrize("call", REFUSED_OVER_VMAP_AXES.values(), ids=REFUSED_OVER_VMAP_AXES)
def test_what_lax_refuses_over_vmap_axes_jaxring_refuses_in_the_call(call):
    x = random_array(np.random.default_rng(10), (DEVICES, BATCH, BATCH), jnp.float32)
    refused_in_the_call = []

    def body(ops, v):
        try:
            return call(ops, v)
        except NotImplementedError:  # jaxring's refusal, in the call itself
            refused_in_the_call.append(ops)
            raise

    def run(ops):
        return jax.pmap(jax.vmap(functools.partial(body, ops), axis_name="j"), "i", devices=jax.devices()[:DEVICES])(x)

    with pytest.raises((NotImplementedError, AssertionError)):  # lax refuses in its batching rule
        run(Lax)
    with pytest.raises(NotImplementedError, match="vmap"):
        run(Ring)
    assert Ring in refused_in_the_call  # (lax refuses groups over a vmap axis in the call too)


UNBOUND = {
    "not under any map": lambda call: jax.jit(call)(jnp.ones((4, 4))),
    "under pmap of another name": lambda call: jax.pmap(call, "i", devices=jax.devices()[:2])(jnp.ones((2, 4, 4))),
    "under vmap of another name": lambda call: jax.vmap(call, axis_name="i")(jnp.ones((2, 4, 4))),
    "under shard_map of another name": lambda call: jax.jit(jax.shard_map(
        call, mesh=Mesh(np.array(jax.devices()[:2]), ("i",)), in_specs=P("i"), out_specs=P("i"), check_vma=False
    ))(jnp.ones((8, 4))),
}


@pytest.mark.parametrize("where", UNBOUND)
@pytest.mark.parametrize("op", ("allreduce", "reduce_scatter", "all_gather"))
def test_an_unbound_axis_raises_lax_s_error_naming_jaxring_s_op(op, where):
    ring_op = getattr(Ring, op)
    lax_op = getattr(Lax, op)
    with pytest.raises(NameError) as lax_refusal:
        UNBOUND[where](lambda v: lax_op(v, "z"))
    assert "unbound axis name: z" in str(lax_refusal.value)
    with pytest.raises(NameError, match=rf"Found an unbound axis name: z\. To fix this, please call jaxring\.{op} "
                                        r"under `jax\.shard_map` or `jax\.pmap`"):
        UNBOUND[where](lambda v: ring_op(v, "z"))


@pytest.mark.parametrize("op", ("sum", "mean", "max"))
def test_processes_true_over_a_vmap_axis_and_a_device_axis_is_lax_s_in_a_job_of_one_process(op):
    """Across processes mpi_workers/communicators.py checks it; with one process it is lax's reduction."""
    x = random_array(np.random.default_rng(16), (2, 3, 4), jnp.float32)
    both = [jax.pmap(jax.vmap(lambda v, r=reduce: r(v, ("i", "j")), axis_name="j"), "i", devices=jax.devices()[:2])(x)
            for reduce in (functools.partial(jaxring.allreduce, op=op, processes=True), ring.LAX_OPS[op])]
    np.testing.assert_allclose(np.asarray(both[0]), np.asarray(both[1]), rtol=1e-6)


@pytest.mark.parametrize("op", ("sum", "mean", "min"))
def test_processes_true_over_vmap_axes_alone_or_none_is_lax_s_in_a_job_of_one_process(op):
    """Across processes mpi_workers/communicators.py checks both (check_without_device_axes)."""
    x = random_array(np.random.default_rng(17), (3, 5), jnp.float32)
    over_vmap = [jax.jit(jax.vmap(lambda v, r=reduce: r(v, "j"), axis_name="j"))(x)
                 for reduce in (functools.partial(jaxring.allreduce, op=op, processes=True), ring.LAX_OPS[op])]
    np.testing.assert_allclose(np.asarray(over_vmap[0]), np.asarray(over_vmap[1]), rtol=1e-6)
    for call in (jax.jit(lambda v: jaxring.allreduce(v, (), op, processes=True)),
                 lambda v: jaxring.allreduce(v, (), op, processes=True)):
        np.testing.assert_array_equal(np.asarray(call(x)), np.asarray(ring.LAX_OPS[op](x, ())))


def test_pytrees_are_scattered_and_gathered_leaf_by_leaf_as_lax_does():
    x = random_array(np.random.default_rng(15), (DEVICES, 2 * DEVICES, VALUES), jnp.float32)

    def body(ops, v):
        tree = {"block": v, "pair": (v[:DEVICES], jnp.int32(3) * jnp.ones(DEVICES, jnp.int32))}
        return ops.reduce_scatter(tree, "i", tiled=True), ops.all_gather([tree, v > 0], "i", axis=1)

    def run(ops):
        return jax.pmap(functools.partial(body, ops), "i", devices=jax.devices()[:DEVICES])(x)

    assert_all_same(run(Ring), run(Lax), DEVICES)
