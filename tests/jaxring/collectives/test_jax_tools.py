"""jaxring's collectives in JAX's tools: roofline reports lax's bytes, checkpoint policies decide as for lax."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import roofline
from jax.sharding import Mesh, PartitionSpec as P

from jaxring.collectives import ring_primitive as ring
from tests.jaxring.collectives.test_lax_parity import Lax, Ring


def collectives(ops, v):
    return (
        ops.allreduce(v, "a"),
        ops.allreduce(v, ("a", "b"), "mean"),
        ops.reduce_scatter(v, "b", scatter_dimension=1, tiled=True),
        ops.all_gather(v, ("b", "a"), axis=1),
    )


@pytest.mark.parametrize("mesh_shape", ((3, 2), (1, 5)), ids=("3x2", "1x5"))
def test_roofline_reports_lax_s_bytes_per_axis(mesh_shape):
    mesh = Mesh(np.array(jax.devices()[: mesh_shape[0] * mesh_shape[1]]).reshape(mesh_shape), ("a", "b"))
    x = jax.ShapeDtypeStruct((mesh_shape[0] * 7, 10 * mesh_shape[1]), jnp.float32)

    def cost(ops):
        spec = P("a", "b")
        return roofline.roofline(functools.partial(collectives, ops), mesh=mesh, in_specs=spec,
                                 out_specs=(P(None, "b"), P(), spec, P(None, None, ("a", "b"))))(x)[1]

    ring_cost, lax_cost = cost(Ring), cost(Lax)
    assert ring_cost.ici_bytes == lax_cost.ici_bytes and ring_cost.ici_latency == lax_cost.ici_latency
    assert sum(lax_cost.ici_bytes.values()) > 0 or mesh_shape[0] == 1


def collectives_in_the_gradient(ops, policy, x):
    """How many collectives the gradient of a checkpointed function runs, and the gradient."""

    def loss(v):
        hidden = jnp.tanh(ops.allreduce(v @ v.T, "i"))
        return (ops.allreduce(hidden @ v, "i", "mean") ** 2).sum()

    grad = jax.pmap(jax.grad(jax.checkpoint(loss, policy=policy)), "i", devices=jax.devices()[:4])
    program = str(jax.make_jaxpr(grad)(x))
    return program.count(f"{ring.ring_p.name}[") + program.count("psum["), grad(x)


@pytest.mark.parametrize("policy", ("everything_saveable", "nothing_saveable", "dots_saveable"))
def test_checkpoint_policies_recompute_ring_collectives_as_lax_s(policy):
    # JAX's policies decide by primitive and name no collective (jaxring/collectives/jax_tools.py).
    x = np.random.default_rng(14).standard_normal((4, 3, 5)).astype(np.float32)
    (ring_count, ring_grad), (lax_count, lax_grad) = (
        collectives_in_the_gradient(ops, getattr(jax.checkpoint_policies, policy), x) for ops in (Ring, Lax))
    assert ring_count == lax_count >= 2
    np.testing.assert_allclose(ring_grad, lax_grad, rtol=1e-5, atol=1e-5)


def test_roofline_costs_the_typing_primitives_as_lax_s_pvary(caplog):
    """all_gather(to="invarying") under check_vma types its result with kinds.invariant_p: roofline has a
    rule for it (no "No roofline rule" warning) and the op's bytes are those of lax's gather to "varying",
    which moves the same bytes (roofline has no rule for lax's all_gather_invariant: it counts none)."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
    x = jax.ShapeDtypeStruct((4 * 3, 5), jnp.float32)

    def cost(ops, to):
        gather = lambda v: ops.all_gather(v, "i", tiled=True, to=to)  # noqa: E731
        return roofline.roofline(gather, mesh=mesh, in_specs=P("i"), out_specs=P() if to == "invarying" else P("i"))(x)[1]

    with caplog.at_level("WARNING"):
        ring_cost = cost(Ring, "invarying")
    assert not [r for r in caplog.records if "No roofline rule for jaxring" in r.getMessage()], caplog.text
    assert ring_cost.ici_bytes == cost(Lax, "varying").ici_bytes and sum(ring_cost.ici_bytes.values()) > 0
