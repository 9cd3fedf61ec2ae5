"""jaxring's collectives against jax.lax's own as the oracle.

Each case runs one function twice, once with lax's ops (psum / pmean,
psum_scatter, all_gather) and once with jaxring's, under jax.shard_map with
check_vma on and off: jaxring must refuse exactly where lax refuses and
otherwise return lax's shapes, dtypes and values (bitwise for integers,
within the dtype's rounding for floats).
"""

import dataclasses
import functools
import math
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jaxring
from jaxring.collectives import arguments as ring
from tests.jaxring.collectives.random_inputs import random_array


class Lax:
    """lax's collectives under jaxring's names and signatures."""

    @staticmethod
    def allreduce(x, axis_name, op="sum", *, axis_index_groups=None):
        return ring.LAX_OPS[op](x, axis_name, axis_index_groups=axis_index_groups)

    tree_allreduce = allreduce
    reduce_scatter = staticmethod(jax.lax.psum_scatter)
    all_gather = staticmethod(jax.lax.all_gather)


class Ring:
    allreduce = staticmethod(jaxring.allreduce)
    tree_allreduce = staticmethod(jaxring.tree_allreduce)
    reduce_scatter = staticmethod(jaxring.reduce_scatter)
    all_gather = staticmethod(jaxring.all_gather)


@dataclasses.dataclass
class Case:
    id: str
    mesh: dict  # axis name -> size
    body: Callable  # (ops, *blocks) -> outputs
    in_specs: tuple
    out_specs: object
    shapes: tuple  # global input shapes
    dtype: object = jnp.float32
    refusal: str | None = None  # where lax refuses: the reason both must give, a key of REFUSALS


# Why lax refuses: (the error class, a pattern of lax's message, a pattern of jaxring's message).
REFUSALS = {
    # shard_map's own check of the outputs, before any collective: the same message for both
    "out_specs": (ValueError, "out_specs which require replication", "out_specs which require replication"),
    "scatter_size": (ValueError, "scatter dimension size 3 must match shard count 4",
                     r"over 4 devices needs dimension 0 of x to equal 4, got shape \(3, 3\)"),
    "gather_axis": (ValueError, "axis 3 is out of bounds for array of dimension 3", r"axis=3 is not an axis"),
    # under check_vma, lax fails an internal assertion (empty message) before naming the axis
    "unbound_axis": (NameError, "unbound axis name: z|^$", "unbound axis name: z"),
    "partly_varying": (ValueError, "can only accept axis_name which corresponds to one of varying",
                       r"of a value varying over some of them only"),
}


def all_three(ops, x, axes, tiled_dim=0):
    """Sum, mean, tiled reduce-scatter and all-gather of one block."""
    return (
        ops.allreduce(x, axes),
        ops.allreduce(x, axes, op="mean"),
        ops.reduce_scatter(x, axes, scatter_dimension=tiled_dim, tiled=True),
        ops.all_gather(x, axes, axis=1),
    )


def grad_of_sum(ops, x, w):
    return jax.grad(lambda v: (ops.allreduce(v * v, "x") * w).sum())(x)


def grad_through_scatter_and_gather(ops, x, w):
    def loss(v):
        mine = ops.reduce_scatter(v * v, "x", scatter_dimension=1, tiled=True)
        return (ops.all_gather(mine * w[:, :2], "x", axis=1, tiled=True) ** 2).sum()

    return jax.grad(loss)(x)


def pmean_fori_loop(ops, x):
    # The typed-carry idiom of JAX's shard_map docs: the carry stays varying.
    return jax.lax.fori_loop(0, 3, lambda _, a: jax.lax.pcast(ops.allreduce(a, "x", op="mean"), "x", to="varying") * 1.5, x)


def scan_carry(ops, x):
    def step(carry, row):
        total = ops.allreduce(row, "x")
        return carry + total, total

    return jax.lax.scan(step, jnp.zeros_like(x[0]), x)


def pytree(ops, x, y):
    return ops.allreduce({"a": x, "b": [y, (x * 2.0, y)]}, ("x", "y"))


CASES = [
    *[
        Case(f"1d-n{n}-{np.dtype(dtype).name}", {"x": n}, lambda ops, x: all_three(ops, x, "x"), (P("x"),), P("x"), ((n * 2 * n, 3),), dtype)
        for n in (1, 2, 3, 8)
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)
        if n == 3 or dtype in (jnp.float32, jnp.int32)
    ],
    # Reducing one axis of two: the sum still varies over the other one.
    Case("2d-one-axis-replicated-out", {"x": 2, "y": 4}, lambda ops, x: ops.allreduce(x, "x"), (P("x", "y"),), P(), ((4, 8),), refusal="out_specs"),
    Case("2d-one-axis-varying-out", {"x": 2, "y": 4}, lambda ops, x: ops.allreduce(x, "x"), (P("x", "y"),), P(None, "y"), ((4, 8),)),
    Case("2d-both-axes", {"x": 2, "y": 4}, lambda ops, x: ops.allreduce(x, ("x", "y")), (P("x", "y"),), P(), ((4, 8),)),
    Case("2d-size-one-axis", {"x": 1, "y": 8}, lambda ops, x: all_three(ops, x, "x"), (P("x", "y"),), P("x", "y"), ((6, 16),)),
    Case(
        "3d-two-axes", {"a": 2, "b": 2, "c": 2}, lambda ops, x: all_three(ops, x, ("a", "c"), 1), (P("a", "b", "c"),), P(None, "b"), ((2, 8, 6),),
        refusal="out_specs",
    ),
    Case("3d-all-axes", {"a": 2, "b": 2, "c": 2}, lambda ops, x: ops.allreduce(x, ("a", "b", "c")), (P("a", "b", "c"),), P(), ((2, 2, 6),)),
    # An input not varying over the axis: lax counts it once per device.
    Case("replicated-input", {"x": 4}, lambda ops, x: ops.allreduce(x, "x"), (P(),), P(), ((5, 3),)),
    Case("replicated-input-gather", {"x": 4}, lambda ops, x: ops.all_gather(x, "x"), (P(),), P(), ((5, 3),), refusal="out_specs"),
    # reduce_scatter and all_gather keep the input's varying axes.
    Case("scatter-replicated-out", {"x": 4}, lambda ops, x: ops.reduce_scatter(x, "x"), (P("x"),), P(), ((16, 3),), refusal="out_specs"),
    Case("scatter-varying-out", {"x": 4}, lambda ops, x: ops.reduce_scatter(x, "x"), (P("x"),), P("x"), ((16, 3),)),
    Case("gather-replicated-out", {"x": 4}, lambda ops, x: ops.all_gather(x, "x", tiled=True), (P("x"),), P(), ((8, 3),), refusal="out_specs"),
    # An input invariant over the reduced axis: lax (jax_auto_pcast) marks it varying first.
    Case("scatter-input-invariant-over-axis", {"x": 2, "y": 2}, lambda ops, x: ops.reduce_scatter(x, "y", tiled=True), (P("x", None),), P("x", "y"), ((4, 6),)),
    Case("gather-input-invariant-over-axis", {"x": 2, "y": 2}, lambda ops, x: ops.all_gather(x, "y"), (P("x", None),), P(None, ("x", "y")), ((4, 6),)),
    Case("gather-tiled-over-both-axes", {"x": 2, "y": 2}, lambda ops, x: ops.all_gather(x, ("x", "y"), tiled=True), (P("x", None),), P(("x", "y")), ((4, 6),)),
    # psum_scatter, as psum, takes a value varying over all the reduced axes or none.
    Case("scatter-input-varying-over-one-of-two-axes", {"x": 2, "y": 2}, lambda ops, x: ops.reduce_scatter(x, ("x", "y"), tiled=True), (P("x"),), P(("x", "y")), ((8,),),
         refusal="partly_varying"),
    Case("scatter-input-varying-over-neither-axis", {"x": 2, "y": 2}, lambda ops, x: ops.reduce_scatter(x, ("x", "y"), tiled=True), (P(),), P(("x", "y")), ((8,),)),
    Case("untiled-scatter-wrong-size", {"x": 4}, lambda ops, x: ops.reduce_scatter(x, "x"), (P("x"),), P("x"), ((12, 3),), refusal="scatter_size"),
    Case("gather-axis-out-of-range", {"x": 4}, lambda ops, x: ops.all_gather(x, "x", axis=3), (P("x"),), P("x"), ((8, 3),), refusal="gather_axis"),
    Case("unbound-axis", {"x": 4}, lambda ops, x: ops.allreduce(x, "z"), (P("x"),), P("x"), ((8, 3),), refusal="unbound_axis"),
    Case("int-mean-is-float", {"x": 3}, lambda ops, x: ops.allreduce(x, "x", op="mean"), (P("x"),), P(), ((3, 5),), jnp.int32),
    Case("grad-allreduce", {"x": 4}, grad_of_sum, (P("x"), P("x")), P("x"), ((8, 5), (8, 5))),
    Case("grad-scatter-gather", {"x": 4}, grad_through_scatter_and_gather, (P("x"), P("x")), P("x"), ((8, 8), (8, 8))),
    Case("fori-loop-carry", {"x": 4}, pmean_fori_loop, (P("x"),), P("x"), ((8, 5),)),
    Case("scan-carry", {"x": 2}, scan_carry, (P(None, "x"),), (P("x"), P(None, "x")), ((3, 4, 5),)),
    Case("vmap-inside", {"x": 4}, lambda ops, x: jax.vmap(lambda r: all_three(ops, r, "x"))(x), (P("x"),), P("x"), ((8, 8, 3),)),
    Case("pytree", {"x": 2, "y": 2}, pytree, (P("x", "y"), P("y", "x")), P(), ((4, 6), (4, 6))),
    Case("pytree-leaf-varying-over-one-axis", {"x": 2, "y": 2}, pytree, (P("x", "y"), P("x")), P(), ((4, 6), (4, 3)), refusal="partly_varying"),
]


def run(ops, case, check_vma, inputs):
    """The case's outputs with `ops`, or the exception it raised."""
    mesh = Mesh(np.array(jax.devices()[: math.prod(case.mesh.values())]).reshape(tuple(case.mesh.values())), tuple(case.mesh))
    program = jax.jit(
        jax.shard_map(
            functools.partial(case.body, ops), mesh=mesh, in_specs=case.in_specs, out_specs=case.out_specs, check_vma=check_vma
        )
    )
    try:
        return jax.tree.map(np.asarray, program(*inputs))
    except Exception as refusal:  # lax's refusals are ValueError, TypeError, NameError...
        return refusal


def assert_same(ring, lax, n_devices):
    assert ring.shape == lax.shape and ring.dtype == lax.dtype, (ring.shape, ring.dtype, lax.shape, lax.dtype)
    if not jnp.issubdtype(lax.dtype, jnp.floating):  # integers and booleans: exact
        assert (ring == lax).all()
        return
    # Both round every partial sum (lax in the input's type, jaxring in float32).
    eps = float(jnp.finfo(lax.dtype).eps)
    scale = np.abs(lax.astype(np.float64)).max(initial=1.0)
    np.testing.assert_allclose(ring.astype(np.float64), lax.astype(np.float64), rtol=0, atol=4 * n_devices * eps * scale)


@pytest.mark.parametrize("check_vma", (True, False), ids=("check_vma", "no_check_vma"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jaxring_matches_lax(case, check_vma):
    rng = np.random.default_rng(len(case.id))
    inputs = [random_array(rng, shape, case.dtype) for shape in case.shapes]
    lax, ring = run(Lax, case, check_vma, inputs), run(Ring, case, check_vma, inputs)
    if isinstance(lax, Exception):
        assert case.refusal, f"lax refuses a case not marked as refused: {lax!r}"
        error, lax_reason, ring_reason = REFUSALS[case.refusal]
        assert isinstance(ring, Exception), f"lax refuses ({lax!r}) but jaxring accepted"
        assert type(ring) is error, f"jaxring refuses with {ring!r}, expected {error.__name__}"
        assert type(lax) is error or (case.refusal == "unbound_axis" and type(lax) is AssertionError), repr(lax)
        assert re.search(lax_reason, str(lax)), f"lax refuses for another reason: {lax!r}"
        assert re.search(ring_reason, str(ring)), f"jaxring refuses for another reason than lax ({lax!r}): {ring!r}"
        return
    assert not isinstance(ring, Exception), f"lax accepts but jaxring refused: {ring!r}"
    assert jax.tree.structure(ring) == jax.tree.structure(lax)
    for got, want in zip(jax.tree.leaves(ring), jax.tree.leaves(lax)):
        assert_same(got, want, math.prod(case.mesh.values()))


def test_vmap_of_pmap_matches_lax():
    x = random_array(np.random.default_rng(7), (4, 3, 6), jnp.float32)  # vmapped, devices, data

    def body(ops, v):
        return ops.allreduce(v, "i"), ops.reduce_scatter(v, "i", tiled=True), ops.all_gather(v, "i", axis=1)

    def run_mapped(ops):
        return jax.vmap(jax.pmap(functools.partial(body, ops), "i", devices=jax.devices()[:3]))(x)

    for got, want in zip(run_mapped(Ring), run_mapped(Lax)):
        assert_same(np.asarray(got), np.asarray(want), 3)



def test_vmap_over_a_trailing_axis_inside_pmap_matches_lax():
    # The batching rule sees the vmapped axis at position 1, not 0 (moved to the front and back).
    x = random_array(np.random.default_rng(9), (3, 6, 5), jnp.float32)  # devices, data, vmapped

    def body(ops, v):
        return ops.allreduce(v, "i"), ops.reduce_scatter(v, "i", tiled=True), ops.all_gather(v, "i", tiled=True)

    def run_mapped(ops):
        return jax.pmap(jax.vmap(functools.partial(body, ops), in_axes=1, out_axes=1), "i", devices=jax.devices()[:3])(x)

    for got, want in zip(run_mapped(Ring), run_mapped(Lax)):
        assert got.shape == want.shape
        assert_same(np.asarray(got), np.asarray(want), 3)

def collectives_in(program, *args):
    """The collective and custom-call instructions XLA compiled `program` to."""
    compiled = program.lower(*args).compile().as_text()
    words = ("custom-call", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
    return [line for line in compiled.splitlines() if any(f" {w}(" in line for w in words)]


def test_a_ring_of_one_compiles_to_no_collective():
    x = random_array(np.random.default_rng(8), (1, 3, 4), jnp.float32)

    def body(v):
        return (
            jaxring.allreduce(v, "i"),
            jaxring.allreduce(v, "i", op="mean"),
            jaxring.reduce_scatter(v[None], "i"),
            jaxring.all_gather(v, "i", axis=1),
        )

    pmapped = jax.pmap(body, "i", devices=jax.devices()[:1])
    assert collectives_in(pmapped, x) == []
    for got, want in zip(pmapped(x), (x, x, x, x[:, :, None])):
        assert (np.asarray(got) == want).all()
    # A size-one axis of a larger mesh: groups of one.
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(8, 1), ("i", "one"))
    for check_vma in (False, True):
        program = jax.jit(
            jax.shard_map(
                lambda v: (jaxring.allreduce(v, "one"), jaxring.all_gather(v, "one", tiled=True)),
                mesh=mesh, in_specs=P("i", "one"), out_specs=(P("i"), P("i", "one")), check_vma=check_vma,
            )
        )
        lowered = program.lower(np.zeros((8, 4), np.float32)).as_text()
        assert "custom_call" not in lowered  # under check_vma, lax's op over groups of one
        if not check_vma:
            assert collectives_in(program, np.zeros((8, 4), np.float32)) == []
