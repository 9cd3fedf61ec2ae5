"""Which leaves of a task's model state the step averages over every replica, and which each replica keeps.

Averaging is the meaning of floating-point statistics only (BatchNorm's
running mean and variance): every replica saw another batch, and their mean
is the statistic of the global batch. An integer, boolean or PRNG-key leaf (a
step counter, an RNG stream's count, a key's data) is never averaged: the mean
of integers is a float, and of keys no key. Each replica keeps its own, as its
loss returned it. Every replica runs the same program, so a counter advances
alike on all of them; the checkpoint holds the first device's (Task contract,
jaxring/engine/task.py).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def is_averaged(leaf) -> bool:
    """True for a floating-point array (a statistic); False for integers, booleans and PRNG keys."""
    dtype = jnp.result_type(leaf)
    return jnp.issubdtype(dtype, jnp.floating) and not jnp.issubdtype(dtype, jax.dtypes.prng_key)


def averaged_part(local):
    """What of `local` = (gradients, model state, loss) one replica's step averages: (gradients, the model
    state's averaged leaves in order, loss)."""
    grads, model_state, loss = local
    return grads, [leaf for leaf in jax.tree_util.tree_leaves(model_state) if is_averaged(leaf)], loss


def with_averaged(model_state, averaged):
    """(gradients, model state, loss) from `averaged` (averaged_part's, after a mean over replicas) and this
    replica's `model_state`, whose leaves that are not averaged stay its own."""
    grads, means, loss = averaged
    leaves, structure = jax.tree_util.tree_flatten(model_state)
    means = iter(means)
    leaves = [next(means) if is_averaged(leaf) else leaf for leaf in leaves]
    return grads, jax.tree_util.tree_unflatten(structure, leaves), loss


def mean_of_step(mean: Callable, local):
    """`local` = (gradients, model state, loss) of one replica, after `mean` (the sync's, over every replica) of
    the gradients, the loss and the model state's averaged leaves; its other leaves stay this replica's."""
    return with_averaged(local[1], mean(averaged_part(local)))
