"""The ring collectives on host devices, against a float64 numpy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jaxring
from tests.jaxring.collectives.random_inputs import random_array

RANKS = (1, 2, 3, 5, 8)
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)
# Odd shapes: 0-d, zero-size, below / not divisible by / equal to the ring size.
SHAPES = ((), (0,), (1,), (2,), (4,), (7,), (1001,), (3, 5, 7), (2, 0, 3), (64, 129))


def tolerance(dtype, ranks, reference):
    """Bound on |ring - float64 sum|: one final rounding for low precision (accumulated in
    float32), float32 rounding of every partial sum otherwise."""
    scale = np.abs(reference).max(initial=1.0)
    if dtype == jnp.int32:
        return 0
    if dtype == jnp.float32:
        return ranks * 2e-7 * scale
    eps = {jnp.bfloat16: 2.0**-8, jnp.float16: 2.0**-11}[dtype]
    return eps * scale + ranks * 2e-7 * scale


def pmapped(fn, ranks):
    return jax.pmap(fn, axis_name="i", devices=jax.devices()[:ranks])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ranks", RANKS)
def test_allreduce_equals_float64_sum_and_is_bitwise_identical(ranks, dtype):
    rng = np.random.default_rng(ranks * 17 + len(np.dtype(dtype).name))
    inputs = [random_array(rng, (ranks, *shape), dtype) for shape in SHAPES]
    # Every shape in one program: also several all-reduces in one launch.
    outputs = pmapped(lambda *xs: [jaxring.allreduce(x, "i") for x in xs], ranks)(*inputs)
    for x, y in zip(inputs, outputs):
        y = np.asarray(y)
        assert y.shape == x.shape and y.dtype == x.dtype
        reference = np.asarray(x, np.float64).sum(axis=0)
        error = np.abs(np.asarray(y[0], np.float64) - reference).max(initial=0)
        assert error <= tolerance(dtype, ranks, reference), (x.shape, error)
        per_device = np.ascontiguousarray(y.reshape(ranks, -1)).view(np.uint8)
        assert (per_device == per_device[:1]).all(), "replicas differ"


@pytest.mark.parametrize("ranks", (3, 8))
def test_allreduce_close_to_psum_and_mean(ranks):
    x = random_array(np.random.default_rng(0), (ranks, 257, 3), jnp.float32)
    ring_sum, psum, ring_mean = pmapped(
        lambda v: (jaxring.allreduce(v, "i"), jax.lax.psum(v, "i"), jaxring.allreduce(v, "i", op="mean")),
        ranks,
    )(x)
    np.testing.assert_allclose(ring_sum, psum, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ring_mean, np.asarray(psum) / ranks, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ranks", (2, 3, 5, 8))
def test_reduce_scatter_returns_the_block_of_the_axis_position(ranks):
    x = random_array(np.random.default_rng(ranks), (ranks, 13, 2 * ranks, 3), jnp.float32)
    untiled, tiled, gathered = pmapped(
        lambda v: (
            jaxring.reduce_scatter(v[:, :ranks], "i", scatter_dimension=1),
            jaxring.reduce_scatter(v, "i", scatter_dimension=1, tiled=True),
            jaxring.all_gather(jaxring.reduce_scatter(v, "i", scatter_dimension=1, tiled=True), "i", axis=1, tiled=True),
        ),
        ranks,
    )(x)
    total = np.asarray(x, np.float64).sum(0)
    assert untiled.shape == (ranks, 13, 3) and tiled.shape == (ranks, 13, 2, 3)
    for position in range(ranks):
        np.testing.assert_allclose(untiled[position], total[:, position], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tiled[position], total[:, 2 * position : 2 * position + 2], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gathered[position], total, rtol=1e-5, atol=1e-5)


def test_all_gather_stacks_or_concatenates_in_axis_order():
    x = np.arange(8 * 5 * 3, dtype=np.int32).reshape(8, 5, 3)
    stacked, on_axis_one, tiled = pmapped(
        lambda v: (jaxring.all_gather(v, "i"), jaxring.all_gather(v, "i", axis=1), jaxring.all_gather(v, "i", axis=1, tiled=True)),
        8,
    )(x)
    assert (np.asarray(stacked) == x).all(axis=(1, 2, 3)).all()
    assert (np.asarray(on_axis_one)[0] == x.transpose(1, 0, 2)).all()
    assert (np.asarray(tiled)[5] == np.concatenate(list(x), axis=1)).all()


def test_grad_of_allreduce_is_allreduce_of_cotangent():
    x = random_array(np.random.default_rng(1), (5, 31), jnp.float32)
    weights = np.random.default_rng(2).standard_normal((5, 31)).astype(np.float32)

    def loss(v, w):
        return (jaxring.allreduce(v, "i") * w).sum()

    grads = pmapped(jax.grad(loss), 5)(x, weights)
    # d/dv_d sum_d' (sum_d'' v_d'') . w_d' = sum_d' w_d'
    np.testing.assert_allclose(grads, np.broadcast_to(weights.sum(0), x.shape), rtol=1e-5, atol=1e-5)


def test_grad_through_reduce_scatter_and_all_gather():
    x = random_array(np.random.default_rng(3), (4, 12), jnp.float32)

    def via_ring(v):
        return (jaxring.all_gather(jaxring.reduce_scatter(v, "i", tiled=True), "i", tiled=True) ** 2).sum()

    def via_psum(v):
        return (jax.lax.psum(v, "i") ** 2).sum()

    np.testing.assert_allclose(
        pmapped(jax.grad(via_ring), 4)(x), pmapped(jax.grad(via_psum), 4)(x), rtol=1e-5, atol=1e-4
    )


def test_vmap_maps_over_the_extra_axis():
    x = random_array(np.random.default_rng(4), (3, 6, 12), jnp.float32)  # devices, batch, data
    summed, chunks = pmapped(
        lambda v: (
            jax.vmap(lambda r: jaxring.allreduce(r, "i"))(v),
            jax.vmap(lambda r: jaxring.reduce_scatter(r, "i", tiled=True))(v),
        ),
        3,
    )(x)
    np.testing.assert_allclose(summed[0], np.asarray(x, np.float64).sum(0), rtol=1e-5, atol=1e-5)
    total = np.asarray(x, np.float64).sum(0)  # 12 -> 3 chunks of 4
    for position in range(3):
        np.testing.assert_allclose(chunks[position], total[:, 4 * position : 4 * position + 4], rtol=1e-5, atol=1e-5)


def test_allreduce_inside_a_loop_runs_every_iteration():
    x = random_array(np.random.default_rng(5), (8, 100), jnp.float32)
    out = pmapped(lambda v: jax.lax.fori_loop(0, 6, lambda _, a: jaxring.allreduce(a, "i", op="mean"), v), 8)(x)
    np.testing.assert_allclose(out[3], np.asarray(x, np.float64).mean(0), rtol=1e-5, atol=1e-6)


def test_shard_map_over_one_axis_and_over_both_axes_of_a_mesh():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    x = random_array(np.random.default_rng(6), (2, 4, 37), jnp.float32)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("a", "b"), out_specs=(P("a", "b"), P("a", "b")))
    def reduce(block):
        return jaxring.allreduce(block, "b"), jaxring.allreduce(block, ("a", "b"))

    over_b, over_both = reduce(x)
    reference = np.asarray(x, np.float64)
    np.testing.assert_allclose(over_b, np.broadcast_to(reference.sum(1, keepdims=True), x.shape), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(over_both, np.broadcast_to(reference.sum((0, 1), keepdims=True), x.shape), rtol=1e-5, atol=1e-5)


def test_a_rank_that_never_arrives_fails_with_its_rank_instead_of_hanging():
    x = np.ones((4, 8), np.float32)

    def skip_on_rank_two(v):
        return jax.lax.cond(
            jax.lax.axis_index("i") == 2, lambda a: a, lambda a: jaxring.allreduce(a, "i", timeout=1.0), v
        )

    with pytest.raises(Exception, match=r"never arrived.*|rank\(s\) \[2\]") as failure:
        np.asarray(pmapped(skip_on_rank_two, 4)(x))
    assert "[2]" in str(failure.value)


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="op must be"):
        pmapped(lambda v: jaxring.allreduce(v, "i", op="prod"), 2)(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="what crosses processes; pass processes=True"):
        pmapped(lambda v: jaxring.allreduce(v, "i", wire_dtype="bfloat16"), 2)(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"cross processes as one of \('bfloat16', 'float16', 'float32'\)"):
        pmapped(lambda v: jaxring.allreduce(v, "i", wire_dtype=np.int8, processes=True), 2)(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("dtype", (jnp.float32, jnp.bfloat16), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ranks", (2, 5, 8))
def test_pipelined_slices_give_the_same_bits_as_whole_chunks(monkeypatch, ranks, dtype):
    x = random_array(np.random.default_rng(7), (ranks, 3001), dtype)
    whole = np.asarray(pmapped(lambda v: jaxring.allreduce(v, "i"), ranks)(x))
    monkeypatch.setitem(jaxring.collectives._ring_call.SLICE_BYTES, "cpu", 96)  # dozens of slices per chunk
    chunk = -(-3001 // ranks)
    sliced, chunks = pmapped(
        lambda v: (jaxring.allreduce(v, "i"), jaxring.reduce_scatter(jnp.pad(v, (0, chunk * ranks - 3001)), "i", tiled=True)),
        ranks,
    )(x)
    assert (np.asarray(sliced).view(np.uint8) == whole.view(np.uint8)).all()
    total = np.pad(np.asarray(x, np.float64).sum(0), (0, chunk * ranks - 3001))
    for position in range(ranks):
        np.testing.assert_allclose(
            np.asarray(chunks[position], np.float64), total[position * chunk : (position + 1) * chunk], rtol=1e-2, atol=1e-2
        )


def test_empty_arrays_come_back_shaped_as_lax_shapes_them():
    x = np.ones((3, 6, 0), np.float32)  # 3 devices, each an empty (6, 0) block
    mine = pmapped(lambda v: (jaxring.allreduce(v, "i"), jaxring.reduce_scatter(v, "i", tiled=True),
                              jaxring.all_gather(v, "i", axis=1)), 3)(x)
    lax = pmapped(lambda v: (jax.lax.psum(v, "i"), jax.lax.psum_scatter(v, "i", tiled=True),
                             jax.lax.all_gather(v, "i", axis=1)), 3)(x)
    assert [(a.shape, a.dtype) for a in mine] == [(b.shape, b.dtype) for b in lax]
