"""docs/USAGE.md's shard_map recipe in its NNX form: pcast only the nnx.Param part, merge with copy=True in the
loss; the gradients' mean is lax's, RNG counts and keys leave invariant, and pcasting the whole state is the
"could not infer replication" wall the page names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxring

AXIS = "batch"


class Net(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(5, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(3, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.norm(self.linear(x)))


def step(cast_whole_state: bool):
    graphdef, params, rest = nnx.split(Net(nnx.Rngs(0)), nnx.Param, ...)
    mesh = jax.make_mesh((len(jax.devices()),), (AXIS,))

    def local(params, rest, x):
        if cast_whole_state:
            params, rest = jax.lax.pcast((params, rest), AXIS, to="varying")
        else:
            params = jax.lax.pcast(params, AXIS, to="varying")

        def loss(params, rest):
            model = nnx.merge(graphdef, params, rest, copy=True)
            return jnp.mean(model(x) ** 2), nnx.state(model, nnx.Not(nnx.Param))

        (_, new_rest), grads = jax.value_and_grad(loss, has_aux=True)(params, rest)
        stats, others = nnx.state(nnx.merge(graphdef, params, new_rest, copy=True), nnx.BatchStat, nnx.RngState)
        return (jaxring.allreduce(grads, AXIS, op="mean"), jax.lax.pmean(grads, AXIS),
                jaxring.allreduce(stats, AXIS, op="mean"), others)

    x = np.random.default_rng(0).normal(size=(4 * len(jax.devices()), 5)).astype(np.float32)
    with jax.set_mesh(mesh):
        run = jax.jit(jax.shard_map(local, in_specs=(P(), P(), P(AXIS)), out_specs=(P(), P(), P(), P())))
        return rest, run(params, rest, jax.device_put(x, NamedSharding(mesh, P(AXIS))))


def test_pcast_only_the_params():
    rest, (grads, lax_grads, _, rng_state) = step(cast_whole_state=False)
    for ours, lax in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(lax_grads)):
        np.testing.assert_allclose(ours, lax, rtol=1e-6, atol=1e-7)
    assert int(rng_state["dropout"]["rngs"]["count"][...]) == int(rest["dropout"]["rngs"]["count"][...]) + 1


def test_pcast_of_the_whole_state_cannot_leave_invariant():
    with pytest.raises(ValueError, match="can't be statically inferred"):
        step(cast_whole_state=True)
