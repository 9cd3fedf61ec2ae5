"""Batches and variables on this process's local devices: split, padded, replicated (what pmap takes).

No MPI here: evaluation, scoring and the task's own scripts use these without starting it.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxring.engine.task import AXIS, SOURCES


def split_for_devices(batch: dict, n_devices: int) -> dict:
    """[B, ...] leaves -> [n_devices, B / n_devices, ...]."""

    def split(x):
        if x.shape[0] % n_devices:
            raise ValueError(
                f"a batch of {x.shape[0]} examples cannot be split evenly over {n_devices} local devices; "
                f"give it a multiple of {n_devices} rows"
            )
        return x.reshape((n_devices, x.shape[0] // n_devices) + x.shape[1:])

    return jax.tree_util.tree_map(split, batch)


def pad_batch(batch: dict, size: int) -> dict:
    """Leaves padded to `size` rows by repeating the last row (outputs of the copies are dropped)."""
    index = np.minimum(np.arange(size), batch_rows(batch) - 1)
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[index], batch)


def split_sources(batch: dict) -> tuple[dict, list[str]]:
    """(the batch's arrays, the names of its examples' sources, if the task gives them)."""
    arrays = dict(batch)
    return arrays, list(arrays.pop(SOURCES, []))


def batch_rows(batch: dict) -> int:
    return len(jax.tree_util.tree_leaves(batch)[0])


def replicate(tree, devices):
    """A copy of `tree` on each device, stacked along a leading axis (what pmap takes)."""
    mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
    stack = lambda x: np.broadcast_to(np.asarray(x)[None], (len(devices),) + np.shape(x))  # noqa: E731
    return jax.tree_util.tree_map(lambda x: jax.device_put(stack(x), sharding), tree)


def unreplicate(tree):
    return jax.tree_util.tree_map(lambda x: np.asarray(x[0]), tree)
