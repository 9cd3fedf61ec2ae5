"""axis_index_groups on jaxring's collectives, against jax.lax's: values, dtypes and refusals.

One ring per group, in the group's order; under pmap and shard_map(check_vma=False), over one
axis and a tuple of axes; permuted groups on odd-sized groups, random inputs, gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jaxring
from tests.jaxring.collectives.random_inputs import random_array
from tests.jaxring.collectives.test_lax_parity import Lax, Ring, assert_same
from tests.jaxring.collectives.test_vmap_axes import assert_all_same

# 6 devices in 2 groups of 3, neither contiguous nor in axis order.
GROUPS = [[4, 0, 3], [1, 5, 2]]


def every_op(ops, v, groups):
    size = len(groups[0])
    return (
        ops.allreduce(v, "i", axis_index_groups=groups),
        ops.allreduce(v, "i", "mean", axis_index_groups=groups),  # divides by the group's size
        ops.reduce_scatter(v[: 2 * size], "i", axis_index_groups=groups, tiled=True),
        ops.reduce_scatter(v[:size], "i", axis_index_groups=groups),
        ops.all_gather(v, "i", axis_index_groups=groups),
        ops.all_gather(v, "i", axis_index_groups=groups, axis=1, tiled=True),
    )


@pytest.mark.parametrize("groups", (GROUPS, [[0, 1, 2, 3, 4, 5]], [[5], [3], [1], [0], [2], [4]]),
                         ids=("two-groups", "one-group", "groups-of-one"))
@pytest.mark.parametrize("dtype", (jnp.float32, jnp.int32), ids=("float32", "int32"))
def test_pmap_with_groups_matches_lax(groups, dtype):
    x = random_array(np.random.default_rng(len(groups)), (6, 12, 5), dtype)

    def run(ops):
        return jax.pmap(lambda v: every_op(ops, v, groups), "i", devices=jax.devices()[:6])(x)

    assert_all_same(run(Ring), run(Lax), 6)


def test_shard_map_with_groups_over_one_axis_and_a_tuple_matches_lax():
    mesh = Mesh(np.array(jax.devices()[:6]).reshape(2, 3), ("a", "b"))
    x = random_array(np.random.default_rng(11), (6, 9, 5), jnp.float32)

    def body(ops, v):
        return (
            ops.allreduce(v, "b", axis_index_groups=[[2, 0, 1]]),
            ops.allreduce(v, ("a", "b"), axis_index_groups=GROUPS),
            ops.all_gather(v, ("a", "b"), axis_index_groups=GROUPS, tiled=True),
            ops.reduce_scatter(v, "b", scatter_dimension=1, axis_index_groups=[[1, 2, 0]], tiled=True),
        )

    def run(ops):
        spec = P(("a", "b"))
        return jax.jit(jax.shard_map(functools.partial(body, ops), mesh=mesh, in_specs=spec,
                                     out_specs=(spec, spec, spec, spec), check_vma=False))(x)

    assert_all_same(run(Ring), run(Lax), 6)


def test_grad_through_groups_matches_lax():
    x = random_array(np.random.default_rng(12), (6, 6), jnp.float32)

    def loss(ops, v):
        gathered = ops.all_gather(v * v, "i", axis_index_groups=GROUPS, tiled=True)
        return (ops.allreduce(gathered, "i", "mean", axis_index_groups=GROUPS) * gathered).sum()

    def run(ops):
        return jax.pmap(jax.grad(functools.partial(loss, ops)), "i", devices=jax.devices()[:6])(x)

    assert_all_same(run(Ring), run(Lax), 6)


def refusal(ops, call, devices=4):
    try:
        jax.pmap(functools.partial(call, ops), "i", devices=jax.devices()[:devices])(jnp.arange(devices * 4.0).reshape(devices, 4))
    except Exception as refused:  # noqa: BLE001 - compared by type and message
        return refused
    return None


@pytest.mark.parametrize("op", ("allreduce", "reduce_scatter", "all_gather"))
def test_groups_that_do_not_cover_the_axis_once_are_refused_as_lax_refuses(op):
    call = lambda ops, v: getattr(ops, op)(v, "i", axis_index_groups=[[0, 1], [1, 2]])  # noqa: E731
    lax_refusal, ring_refusal = refusal(Lax, call), refusal(Ring, call)
    assert type(lax_refusal) is type(ring_refusal) is ValueError
    assert str(lax_refusal) in str(ring_refusal)  # lax's words, then what jaxring got


def test_groups_lax_passes_to_xla_unchecked_are_refused_at_trace_time():
    # Indices 0..1 only of an axis of 4: lax fails inside XLA; groups of different sizes for an op whose
    # output shape is a group's size: lax sizes it by the first group's.
    with pytest.raises(ValueError, match="cover all indices exactly once"):
        jax.pmap(lambda v: jaxring.allreduce(v, "i", axis_index_groups=[[0, 1]]), "i",
                 devices=jax.devices()[:4])(jnp.ones((4, 3)))
    for op in (jaxring.reduce_scatter, jaxring.all_gather):
        with pytest.raises(ValueError, match="all be the same size"):
            jax.pmap(lambda v: op(v, "i", axis_index_groups=[[0], [1, 2, 3]]), "i",  # noqa: B023
                     devices=jax.devices()[:4])(jnp.ones((4, 3)))


LAX_REDUCTIONS = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}
# Of sizes 1, 2 and 5 (the first of one: not a ring of one), neither contiguous nor in axis order;
# lax's CPU all-reduce takes them (TPU refuses them).
UNEVEN = [[3], [5, 1], [0, 2, 7, 4, 6]]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32, jnp.uint8, jnp.bool_, jnp.complex64],
                         ids=lambda d: jnp.dtype(d).name)
def test_allreduce_within_groups_of_different_sizes_is_lax_s_sum_max_and_min(dtype):
    rng = np.random.default_rng(23)
    if dtype == jnp.bool_:
        x = rng.random((8, 3, 5)) > 0.5
    elif dtype == jnp.uint8:
        x = rng.integers(0, 256, (8, 3, 5)).astype(np.uint8)  # sums wrap, as lax's
    elif dtype == jnp.complex64:
        x = (random_array(rng, (8, 3, 5), jnp.float32) + 1j * random_array(rng, (8, 3, 5), jnp.float32)).astype(dtype)
    else:
        x = random_array(rng, (8, 3, 5), dtype)
    if dtype == jnp.float32:
        x[3, 0, 0], x[1, 1, 1] = -0.0, np.nan  # a group of one keeps -0.0; max/min skip NaN as lax's
    ops = ("sum",) if dtype == jnp.complex64 else ("sum", "max", "min")
    for op in ops:
        ring, lax = (jax.pmap(lambda v: reduce(v, "i", axis_index_groups=UNEVEN), "i")(x)  # noqa: B023
                     for reduce in (functools.partial(jaxring.allreduce, op=op), LAX_REDUCTIONS[op]))
        assert ring.dtype == lax.dtype
        if op == "sum" and jnp.issubdtype(dtype, jnp.inexact):  # added in the axis' order, lax's in the group's
            scale = np.nanmax(np.abs(np.asarray(lax)))
            np.testing.assert_allclose(np.asarray(ring), np.asarray(lax), rtol=0, atol=4 * 8 * 2 ** -23 * scale)
            assert np.signbit(np.asarray(ring)[3, 0, 0]) if dtype == jnp.float32 else True  # -0.0 alone stays -0.0
        else:  # integers wrap alike, max and min pick the same element
            np.testing.assert_array_equal(np.asarray(ring), np.asarray(lax), err_msg=op)


def test_mean_within_groups_of_different_sizes_divides_each_by_its_own_size():
    """lax.pmean divides every group's sum by the first group's size (jax 0.10.2 takes the size
    from psum(1), which it computes as len(axis_index_groups[0])); jaxring by each group's."""
    x = random_array(np.random.default_rng(29), (8, 4), jnp.float32)
    mean = jax.pmap(lambda v: jaxring.allreduce(v, "i", "mean", axis_index_groups=UNEVEN), "i")(x)
    for group in UNEVEN:
        expected = x[group].astype(np.float64).mean(axis=0)
        for device in group:
            np.testing.assert_allclose(np.asarray(mean[device]), expected, rtol=2e-6)
    lax_mean = jax.pmap(lambda v: jax.lax.pmean(v, "i", axis_index_groups=UNEVEN), "i")(x)
    np.testing.assert_allclose(np.asarray(lax_mean[0]), x[UNEVEN[2]].sum(0) / len(UNEVEN[0]), rtol=1e-6)  # as described

    def gradient(reduce):  # a sum's: each device gets its group's cotangents, summed
        return jax.pmap(jax.grad(lambda v: jnp.sum(jnp.sin(reduce(v, "i", axis_index_groups=UNEVEN)) * v)), "i")(x)
    np.testing.assert_allclose(np.asarray(gradient(jaxring.allreduce)), np.asarray(gradient(jax.lax.psum)), rtol=1e-5)


def test_groups_where_lax_or_jaxring_take_none_are_refused_at_trace_time():
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
    typed = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "i", axis_index_groups=[[0, 1], [2, 3]]),
                                  mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    with pytest.raises(NotImplementedError, match="check_vma"):  # lax.psum's refusal there
        typed(jnp.ones(8))
    with pytest.raises(NotImplementedError):
        jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i", axis_index_groups=[[0, 1], [2, 3]]),
                              mesh=mesh, in_specs=P("i"), out_specs=P("i")))(jnp.ones(8))


def test_groups_with_processes_true_in_a_job_of_one_process_are_the_groups_own_reduction():
    """Across processes (mpi_workers/communicators.py checks several), processes=True with groups reduces
    each group of every process; with one process that is the groups' reduction, as lax.psum's."""
    x = random_array(np.random.default_rng(12), (4, 3), jnp.float32)
    for groups in ([[0, 2], [1, 3]], [[3], [0, 1, 2]]):
        both = [jax.pmap(lambda v, p=p, g=groups: reduce(v, "i", axis_index_groups=g, **p), "i",
                         devices=jax.devices()[:4])(x)
                for reduce, p in ((jaxring.allreduce, {"processes": True}), (jax.lax.psum, {}))]
        np.testing.assert_allclose(np.asarray(both[0]), np.asarray(both[1]), rtol=1e-6, err_msg=str(groups))


def test_all_gather_to_is_lax_s_or_refused_by_name():
    x = random_array(np.random.default_rng(13), (4, 3), jnp.float32)
    invarying = [jax.pmap(lambda v: ops.all_gather(v, "i", to="invarying"), "i", devices=jax.devices()[:4])(x)  # noqa: B023
                 for ops in (Ring, Lax)]
    assert_same(np.asarray(invarying[0]), np.asarray(invarying[1]), 4)
    call = lambda ops, v: ops.all_gather(v, "i", to="replicated")  # noqa: E731
    lax_refusal, ring_refusal = refusal(Lax, call), refusal(Ring, call)
    assert type(lax_refusal) is type(ring_refusal) is ValueError and "Allowed `to` values" in str(ring_refusal)
    # Untyped (pmap), to="reduced" is lax's refusal (tests/jaxring/collectives/test_explicit_sharding.py types it).
    untyped_reduced = lambda ops, v: ops.all_gather(v, "i", to="reduced")  # noqa: E731
    lax_refusal, ring_refusal = refusal(Lax, untyped_reduced), refusal(Ring, untyped_reduced)
    assert type(lax_refusal) is type(ring_refusal) and str(lax_refusal) == str(ring_refusal), (lax_refusal, ring_refusal)
    grouped = lambda ops, v: ops.all_gather(v, "i", to="invarying", axis_index_groups=[[0, 1], [2, 3]])  # noqa: E731
    assert isinstance(refusal(Ring, grouped), NotImplementedError) and isinstance(refusal(Lax, grouped),
                                                                                   NotImplementedError)


@pytest.mark.parametrize("names", ["i", ("a", "i")], ids=["one_axis", "two_axes"])
@pytest.mark.parametrize("tiled,axis", [(True, 0), (False, 1), (True, 1)])
def test_all_gather_to_invarying_under_check_vma_is_lax_s_values_types_and_gradients(names, tiled, axis):
    """Typed invariant over the gathered axes (out_specs may drop them) and differentiated as
    lax's: each device's input gets its own block of the (invariant) cotangent; forward mode and
    second order too."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "i"))
    rng = np.random.default_rng(17)
    x = random_array(rng, (2 * 3, 4 * 5), jnp.float32)
    kept = P() if names == ("a", "i") else P("a")

    def gathered_by(gather):
        return jax.shard_map(lambda v: gather(v, names, to="invarying", tiled=tiled, axis=axis), mesh=mesh,
                             in_specs=P("a", "i"), out_specs=kept)

    def loss(gather, v):
        g = gathered_by(gather)(v)
        return jnp.sum(jnp.sin(g) * jnp.cos(g).sum())

    values = [jax.jit(gathered_by(gather))(x) for gather in (jaxring.all_gather, jax.lax.all_gather)]
    np.testing.assert_array_equal(*map(np.asarray, values))  # a gather: exact
    ring, lax = (jax.jit(jax.grad(functools.partial(loss, gather)))(x) for gather in (jaxring.all_gather, jax.lax.all_gather))
    assert ring.shape == lax.shape == x.shape and ring.dtype == lax.dtype
    # the same slices of the same cotangent, which XLA sums (cos(g).sum()) in a program-dependent order
    np.testing.assert_allclose(np.asarray(ring), np.asarray(lax), rtol=1e-5, atol=1e-5 * float(np.abs(lax).max()))
    # Forward mode and second order, as lax's (JAX's own test_all_gather_invariant_basic needs both).
    t = random_array(rng, x.shape, jnp.float32)
    tangents = [jax.jit(jax.jvp, static_argnums=0)(gathered_by(gather), (x,), (t,))[1]
                for gather in (jaxring.all_gather, jax.lax.all_gather)]
    np.testing.assert_array_equal(*map(np.asarray, tangents))
    hessian_vector = [jax.jit(lambda v, w, g=gather: jax.jvp(jax.grad(functools.partial(loss, g)), (v,), (w,))[1])(x, t)
                      for gather in (jaxring.all_gather, jax.lax.all_gather)]
    scale = float(np.abs(hessian_vector[1]).max())
    np.testing.assert_allclose(*map(np.asarray, hessian_vector), rtol=1e-4, atol=1e-5 * scale)
