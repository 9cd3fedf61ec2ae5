"""Gradient sync: the one place where a step's per-device results become their mean over every replica.

One path for one process or many: inside the pmapped step, the leaves are
packed into buckets of at most `bucket_bytes` and each bucket is averaged
over the local devices and, with several MPI processes, over every process,
in the same compiled program (jaxring.tree_allreduce(processes=True): local
ring, MPI ring of processes, local ring). `train.allreduce: psum` does the
local part with jax.lax's collectives instead of jaxring's ring
(tree_allreduce(local="lax")); across processes it still needs jaxring's MPI
leg. `train.across_processes: mpi4jax` crosses processes with mpi4jax instead
(jaxring/engine/sync_mpi4jax.py). See docs/ARCHITECTURE.md, "Data flow of one step".
"""

from __future__ import annotations

import jax

import jaxring
from jaxring.engine.task import AXIS
from jaxring.engine.timing import median_seconds


class Sync:
    """Mean over every device of every process, inside one pmapped step."""

    across_processes = "jaxring"  # train.across_processes: whose collective crosses processes

    def __init__(self, world_size: int, method: str, bucket_bytes: int, wire_dtype: str | None = None):
        # method: train.allreduce, "ring" or "psum"; wire_dtype: train.allreduce_dtype, what the
        # buckets cross processes in (both checked by jaxring.engine.config)
        self.world_size = world_size
        self.method = method
        self.bucket_bytes = bucket_bytes
        self.wire_dtype = wire_dtype if world_size > 1 else None

    def mean(self, tree):
        """Mean of every leaf over AXIS and every process, inside pmap; one collective per fused bucket."""
        local = "ring" if self.method == "ring" else "lax"
        return jaxring.tree_allreduce(tree, AXIS, "mean", bucket_bytes=self.bucket_bytes,
                                      processes=self.world_size > 1, wire_dtype=self.wire_dtype, local=local)

    def time_mean(self, tree, repeats: int, warmup: int = 1) -> float:
        """Seconds of the mean of `tree` (replicated over the local devices) as a step pays it:
        the median of `repeats` calls after `warmup` untimed ones.

        A step reduces values its program computed, so the mean is timed over
        `tree` doubled inside the program, less the program that only doubles
        it: over the program's arguments themselves the all-reduce would not
        run in place as it does in a step (docs/USAGE.md).
        """
        def doubled(t):
            return jax.tree_util.tree_map(lambda leaf: leaf * 2, t)

        with_mean = self._mean_after(doubled)
        alone = jax.pmap(doubled, axis_name=AXIS)
        return max(0.0, median_seconds(lambda: with_mean(tree), repeats, warmup)
                   - median_seconds(lambda: alone(tree), repeats, warmup))

    def _mean_after(self, fn):
        """The program time_mean times: the mean of fn(tree), pmapped."""
        return jax.pmap(lambda t: self.mean(fn(t)), axis_name=AXIS)

    def train_step(self, whole, parts, devices):
        """The step make_train_step returns: `whole`, its one pmapped program with this mean inside."""
        return whole


def make_sync(world_size: int, method: str, bucket_bytes: int, wire_dtype: str | None = None) -> Sync:
    """jaxring's sync for a run of `world_size` processes; `method` is train.allreduce ("ring" or "psum"),
    `wire_dtype` train.allreduce_dtype (train.across_processes mpi4jax: sync_mpi4jax.sync_for)."""
    return Sync(world_size, method, bucket_bytes, wire_dtype)
