"""train.compute_dtype: the loss computed in bfloat16 or float16 while the weights stay float32.

The engine casts the parameters and the batch's floating-point arrays to the
compute dtype before the task's loss, so JAX differentiates through the casts
and the gradients come back float32, for float32 master weights and
optimizer. float16's narrow range also needs the loss scaled before the
backward pass (small gradients would flush to zero) and the gradients unscaled
after: dynamic loss scaling, where a step whose gradients overflow is skipped
and the scale halved, and the scale doubles after GROWTH_INTERVAL good steps.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
INITIAL_SCALE = 2.0**15
GROWTH_INTERVAL = 2000  # good steps before the scale doubles


def cast_floats(tree, dtype):
    """`tree` with every floating-point leaf as `dtype` (integers and booleans as they are)."""
    def cast(leaf):
        return leaf.astype(dtype) if jnp.issubdtype(jnp.result_type(leaf), jnp.floating) else leaf

    return jax.tree_util.tree_map(cast, tree)


def like(tree, reference):
    """`tree` with each leaf cast back to the dtype of `reference`'s: state keeps its dtypes across steps."""
    return jax.tree_util.tree_map(lambda leaf, ref: leaf.astype(jnp.result_type(ref)), tree, reference)


@flax.struct.dataclass
class LossScale:
    scale: jax.Array  # float32: the factor the loss is multiplied by before the backward pass
    good_steps: jax.Array  # int32: steps since the scale last changed

    @classmethod
    def initial(cls) -> LossScale:
        return cls(jnp.asarray(INITIAL_SCALE, jnp.float32), jnp.zeros((), jnp.int32))

    def after(self, finite) -> LossScale:
        """The scale for the next step: halved after an overflow, doubled after GROWTH_INTERVAL good steps."""
        grow = finite & (self.good_steps + 1 >= GROWTH_INTERVAL)
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2, self.scale), jnp.maximum(self.scale / 2, 1.0))
        good_steps = jnp.where(finite & ~grow, self.good_steps + 1, 0)
        return LossScale(scale.astype(jnp.float32), good_steps.astype(jnp.int32))


def all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(tree)]))
