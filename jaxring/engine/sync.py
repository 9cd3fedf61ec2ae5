"""Gradient sync: the one place where a step's per-device results become their mean over every replica.

`make_sync` picks the strategy once, from the world:

- one process: the mean over the local devices inside the pmapped step
  (jaxring's fused ring, or jax.lax.pmean with `allreduce: psum`);
- several MPI processes: mpi4jax ops cannot sit in a multi-device pmap, so
  the step is cut in two pmaps around jaxring.global_allreduce (local ring,
  ring of processes, local ring), one call per fused bucket.

Either way the leaves travel in buckets of at most `bucket_bytes` (tensor
fusion, jaxring.collectives.fusion). See docs/ARCHITECTURE.md,
"Data flow of one step".
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np

from jaxring.collectives import fusion
from jaxring.engine.task import AXIS

# local(state, batch) -> the tree to average; finish(state, averaged tree) -> the step's result.
Local = Callable[[Any, Any], Any]
Finish = Callable[[Any, Any], Any]


class InProcessSync:
    """Mean over the local devices of the only process, inside one pmapped step."""

    def __init__(self, method: str, bucket_bytes: int):
        self.method = method
        self.bucket_bytes = bucket_bytes

    def mean(self, tree):
        """Mean of every leaf over AXIS, inside pmap."""
        if self.method == "ring":
            return fusion.tree_allreduce(tree, AXIS, op="mean", bucket_bytes=self.bucket_bytes)
        return jax.lax.pmean(tree, AXIS)

    def pmap_step(self, local: Local, finish: Finish):
        """(state, device batch) -> finish(state, mean of local(state, batch)); `state` is donated."""
        return jax.pmap(lambda state, batch: finish(state, self.mean(local(state, batch))), axis_name=AXIS, donate_argnums=0)

    def time_mean(self, tree, repeats: int) -> float:
        """Median seconds of the mean of `tree` (replicated over the local devices)."""
        return _median_seconds(jax.pmap(self.mean, axis_name=AXIS), tree, repeats)


class CrossProcessSync:
    """Mean over every device of every process: pmap, global all-reduce per bucket, pmap."""

    def __init__(self, method: str, bucket_bytes: int):
        self.algorithm = "ring" if method == "ring" else "mpi"  # psum: MPI_Allreduce across processes
        self.bucket_bytes = bucket_bytes

    def mean(self, buckets: list) -> list:
        """Means of fused buckets [local devices, n] over all processes, outside jit."""
        from jaxring.collectives.mpi import global_allreduce  # imports mpi4jax: only when several processes

        return [global_allreduce(bucket, op="mean", algorithm=self.algorithm) for bucket in buckets]

    def pmap_step(self, local: Local, finish: Finish):
        """(state, device batch) -> finish(state, mean of local(state, batch)); `state` is donated."""
        packing = _Fusion(self.bucket_bytes)
        packed = jax.pmap(lambda state, batch: packing.pack(local(state, batch)), axis_name=AXIS)
        update = jax.pmap(lambda state, buckets: finish(state, packing.unpack(buckets)), axis_name=AXIS, donate_argnums=0)
        return lambda state, batch: update(state, self.mean(packed(state, batch)))

    def time_mean(self, tree, repeats: int) -> float:
        """Median seconds of the mean of `tree` (replicated over the local devices)."""
        packing = _Fusion(self.bucket_bytes)
        pack = jax.pmap(packing.pack, axis_name=AXIS)
        return _median_seconds(lambda t: self.mean(pack(t)), tree, repeats)


class _Fusion:
    """pack() inside one pmap, unpack() inside the next: the layout of the last tree packed carries over."""

    def __init__(self, bucket_bytes: int):
        self.bucket_bytes = bucket_bytes
        self.layout = None

    def pack(self, tree) -> list:
        flats, self.layout = fusion.pack(tree, self.bucket_bytes)
        return flats

    def unpack(self, flats: list):
        return fusion.unpack(flats, self.layout)


def _median_seconds(fn, tree, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call compiles
        start = time.perf_counter()
        jax.block_until_ready(fn(tree))
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def make_sync(world_size: int, method: str, bucket_bytes: int) -> InProcessSync | CrossProcessSync:
    """The sync for a run of `world_size` processes; `method` is train.allreduce ("ring" or "psum")."""
    if world_size == 1:
        return InProcessSync(method, bucket_bytes)
    return CrossProcessSync(method, bucket_bytes)
