"""jaxring's collectives against jax.lax's over every kind of operand lax accepts, in every context.

A user replacing lax.psum with jaxring.allreduce may pass whatever lax takes:
Python and numpy scalars (`psum(1, "i")`, the device count), 0-d arrays,
constants closed over, the mapped function's own argument, values the program
computed, empty arrays. For every public op, every context and every such
operand, jaxring must give lax's shape, dtype, weak type, varying axes and
values, or refuse where lax refuses, with an error of lax's class for the
same reason.

Each context traces one program holding every (op, operand) pair, each pair
traced inside its own try, so a refusal (raised while tracing) is recorded
for its pair and the rest compile once: two compilations per context.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tests.jaxring.collectives.operand_kinds import BLOCK, OPERANDS
from tests.jaxring.collectives.random_inputs import random_array
from tests.jaxring.collectives.test_lax_parity import Lax, Ring, assert_same

N = BLOCK[0]  # devices per ring: an untiled reduce_scatter of a block is accepted
AXIS = "i"
BATCH = 2  # vmap's axis in the vmap-inside-pmap context

OPS = {
    "allreduce-sum": lambda ops, x: ops.allreduce(x, AXIS),
    "allreduce-mean": lambda ops, x: ops.allreduce(x, AXIS, op="mean"),
    "reduce_scatter": lambda ops, x: ops.reduce_scatter(x, AXIS),
    "reduce_scatter-tiled": lambda ops, x: ops.reduce_scatter(x, AXIS, tiled=True),
    "all_gather": lambda ops, x: ops.all_gather(x, AXIS),
    "all_gather-tiled": lambda ops, x: ops.all_gather(x, AXIS, axis=0, tiled=True),
    "tree_allreduce": lambda ops, x: ops.tree_allreduce({"a": x, "b": [x, x]}, AXIS, op="mean"),
}


def leaves_total(tree):
    return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(tree))


def direct(ops, op, operand):
    return op(ops, operand)


def grad(ops, op, operand):
    """The gradient through the op, its cotangents both a broadcast constant and a computed value."""
    return jax.grad(lambda y: leaves_total(jax.tree.map(lambda o: o + o * o, op(ops, y))))(operand)


def custom_vjp(ops, op, operand):
    """The op in a custom_vjp's forward, and in its backward with an all-reduce of a literal."""

    @jax.custom_vjp
    def f(y):
        return op(ops, y)

    def backward(y, cotangent):
        # Invariant over the devices (a mean), so the cotangent has y's type under check_vma too.
        scale = ops.allreduce(leaves_total(op(ops, y)) * leaves_total(cotangent), AXIS, op="mean")
        return (jnp.zeros_like(y) + (scale * ops.allreduce(1.0, AXIS)).astype(y.dtype),)

    f.defvjp(lambda y: (f(y), y), backward)
    return jax.grad(lambda y: leaves_total(f(y)))(operand)


def program(ops, transform, refusals, types):
    """The mapped function: every (op, operand) pair; refusals and output types recorded while tracing."""

    def body(v):
        results = {}
        for op_name, op in OPS.items():
            for operand_name, operand in OPERANDS.items():
                pair = f"{op_name}/{operand_name}"
                try:
                    results[pair] = transform(ops, op, operand(v))
                except Exception as refusal:  # lax's refusals are ValueError, TypeError, IndexError...
                    refusals[pair] = refusal
                    continue
                types[pair] = [
                    (t.shape, t.dtype, t.weak_type, frozenset(getattr(t, "vma", ())))
                    for t in map(jax.typeof, jax.tree.leaves(results[pair]))
                ]
        return results

    return body


def on_pmap(body, x):
    return jax.pmap(body, AXIS, devices=jax.devices()[:N])(x.reshape(N, *BLOCK))


def on_jit_pmap(body, x):
    return jax.jit(jax.pmap(body, AXIS, devices=jax.devices()[:N]))(x.reshape(N, *BLOCK))


def on_vmap_inside_pmap(body, x):
    batched = np.stack([x, x[::-1] * 0.5], axis=1).reshape(N, BATCH, *BLOCK)
    return jax.pmap(jax.vmap(body), AXIS, devices=jax.devices()[:N])(batched)


def stacked(body):
    """`body` with each output stacked over the devices, as pmap returns it (out_specs P(AXIS))."""
    return lambda v: jax.tree.map(lambda out: jnp.asarray(out)[None], body(v))  # lax may return Python scalars


def mesh():
    return Mesh(np.array(jax.devices()[:N]), (AXIS,))


def on_shard_map(body, x, check_vma=True):
    return jax.jit(jax.shard_map(stacked(body), mesh=mesh(), in_specs=P(AXIS), out_specs=P(AXIS), check_vma=check_vma))(x)


def on_jit_over_mesh(body, x):
    with jax.set_mesh(mesh()):
        mapped = jax.shard_map(stacked(body), in_specs=P(AXIS), out_specs=P(AXIS))  # the mesh of the context
        return jax.jit(mapped)(jax.device_put(x, NamedSharding(mesh(), P(AXIS))))


CONTEXTS = {
    "pmap": (on_pmap, direct),
    "jit-pmap": (on_jit_pmap, direct),
    "shard_map-check_vma": (on_shard_map, direct),
    "shard_map-no-check_vma": (functools.partial(on_shard_map, check_vma=False), direct),
    "jit-over-mesh": (on_jit_over_mesh, direct),
    "vmap-inside-pmap": (on_vmap_inside_pmap, direct),
    "grad-pmap": (on_pmap, grad),
    "grad-shard_map-check_vma": (on_shard_map, grad),
    "custom_vjp-pmap": (on_pmap, custom_vjp),
    "custom_vjp-shard_map-check_vma": (on_shard_map, custom_vjp),
}

# Why lax refuses a pair: (a pattern of lax's message, a pattern of jaxring's message).
REFUSALS = {
    "scatter of a scalar": ("tuple index out of range", "reduce_scatter of a 0-dimensional x"),
    "tiled gather of a scalar": ("axis 0 is out of bounds for array of dimension 0",
                                 r"all_gather\(tiled=True\) concatenates along an axis of x; x is a scalar"),
    "grad of an integer": ("grad requires real- or complex-valued inputs", "grad requires real- or complex-valued inputs"),
}


def run(ops, context):
    """(outputs as numpy, refusals, output types) of the context's program with `ops`."""
    mapper, transform = CONTEXTS[context]
    refusals, types = {}, {}
    x = random_array(np.random.default_rng(len(context)), (N * N, BLOCK[1]), jnp.float32)
    outputs = mapper(program(ops, transform, refusals, types), x)
    return jax.tree.map(np.asarray, outputs), refusals, types


def assert_same_refusal(pair, ring, lax):
    reasons = [why for why, (lax_reason, _) in REFUSALS.items() if re.search(lax_reason, str(lax))]
    assert reasons, f"{pair}: lax refuses for a reason this test does not know: {lax!r}"
    ring_reason = REFUSALS[reasons[0]][1]
    assert ring is not None, f"{pair}: lax refuses ({lax!r}) but jaxring accepts"
    # Code that catches lax's error catches jaxring's.
    assert isinstance(ring, type(lax)), f"{pair}: jaxring refuses with {ring!r}, lax with {lax!r}"
    assert re.search(ring_reason, str(ring)), f"{pair}: jaxring refuses for another reason than lax ({lax!r}): {ring!r}"


@pytest.mark.parametrize("context", CONTEXTS)
def test_every_op_on_every_operand_matches_lax(context):
    lax_out, lax_refusals, lax_types = run(Lax, context)
    ring_out, ring_refusals, ring_types = run(Ring, context)
    for pair, refusal in lax_refusals.items():
        assert_same_refusal(pair, ring_refusals.get(pair), refusal)
    wrongly_refused = {pair: refusal for pair, refusal in ring_refusals.items() if pair not in lax_refusals}
    assert not wrongly_refused, f"lax accepts, jaxring refuses: {wrongly_refused}"
    mistyped = {pair: (ring_types[pair], lax_types[pair]) for pair in lax_types if ring_types[pair] != lax_types[pair]}
    assert not mistyped, f"(shape, dtype, weak type, varying axes) of each leaf, jaxring's then lax's: {mistyped}"
    assert lax_out.keys() == ring_out.keys()
    for pair in lax_out:
        assert jax.tree.structure(ring_out[pair]) == jax.tree.structure(lax_out[pair]), pair
        for got, want in zip(jax.tree.leaves(ring_out[pair]), jax.tree.leaves(lax_out[pair])):
            assert_same(got, want, N)
