"""Tensor fusion: a pytree's leaves packed into a few flat buckets, one all-reduce each.

A gradient tree has many small leaves; one ring per leaf would pay the ring's
2(N-1) synchronisation steps per leaf. Packing leaves of one dtype into
buckets of up to `bucket_bytes` pays them once per bucket.
"""

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.collectives import across_processes, arguments
from jaxring.collectives.allreduce import allreduce

# Small leaves (biases, norms) are fused; leaves of a bucket's size or more
# travel alone, uncopied. The best size depends on the platform, so the
# default is one per platform (jax's Device.platform names):
# - "cpu": packing costs a copy in and a copy out, and each collective a
#   fixed cost: fuse the small leaves, let large ones travel alone. The
#   engine's sync, queued, alternated (scripts/bench/bench_fusion.py on 2, 4 and 8
#   host devices, docs/PERFORMANCE.md): 256 KiB buckets took 0.59-0.88x the
#   time of 1 MiB ones on ds2_tiny (whose 196-393 KB weights 1 MiB buckets
#   copy) and 0.56-1.15x on a 38-leaf transformer; one collective per leaf
#   took 0.88-1.46x the time of 256 KiB buckets on ds2_tiny and 1.23-2.43x
#   on the transformer. Large buckets copy large leaves: a 71 MB tree of
#   3 MB weights took 62 ms in 1 MiB buckets, 212 ms in 4 MiB ones.
# - "gpu": copies are cheap and each ring op has a fixed cost; the cost model
#   fitted to H100 figures (docs/SCALING.md, scripts/bench/project_scaling.py) puts
#   the smallest bucket within 5% of the best ds2_paper step at 128 GPUs at
#   64 MiB for both CUDA engines. On one H200 (8 virtual ranks, 2026-11-26,
#   docs/PERFORMANCE.md) ds2_paper's all-reduce took 1.71-1.75 ms in 64 MiB
#   buckets, 1.54-1.56 ms in one bucket of 256 MiB, 4.8-5.1 ms in 1 MiB ones.
DEFAULT_BUCKET_BYTES = {"cpu": 256 << 10, "gpu": 64 << 20}


def default_bucket_bytes(platform: str | None = None) -> int:
    """The default bucket size for devices of `platform` (jax.default_backend() when None)."""
    platform = platform or jax.default_backend()
    if platform not in DEFAULT_BUCKET_BYTES:
        raise ValueError(
            f"jaxring has no default bucket size for platform {platform!r} (it knows {sorted(DEFAULT_BUCKET_BYTES)}); "
            "pass bucket_bytes (train.bucket_bytes in a config)"
        )
    return DEFAULT_BUCKET_BYTES[platform]


def plan_buckets(leaves, bucket_bytes):
    """Indices of the leaves in each bucket: same dtype, in tree order, <= bucket_bytes.

    A leaf larger than bucket_bytes gets a bucket of its own; empty leaves none.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets, open_bucket = [], {}  # dtype -> (indices, bytes)
    for i, leaf in enumerate(leaves):
        if leaf.size == 0:
            continue
        dtype = np.dtype(leaf.dtype)
        nbytes = leaf.size * dtype.itemsize
        indices, used = open_bucket.get(dtype, ([], 0))
        if indices and used + nbytes > bucket_bytes:
            buckets.append(indices)
            indices, used = [], 0
        open_bucket[dtype] = (indices + [i], used + nbytes)
    buckets.extend(indices for indices, _ in open_bucket.values())
    return sorted(buckets, key=lambda b: b[0])


class Layout(NamedTuple):
    """Where each leaf of a packed tree lies: static, known at trace time."""

    treedef: Any
    leaves: list  # (shape, dtype) of each leaf
    buckets: list  # leaf indices of each flat bucket, from plan_buckets


def pack(tree, bucket_bytes):
    """(flat buckets, their Layout): the leaves of `tree` concatenated per plan_buckets."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    buckets = plan_buckets(leaves, bucket_bytes)
    flats = [jnp.concatenate([leaves[i].reshape(-1) for i in indices]) for indices in buckets]
    return flats, Layout(treedef, [(leaf.shape, leaf.dtype) for leaf in leaves], buckets)


def unpack(flats, layout: Layout):
    """The tree that pack() packed into `layout`, its leaves taken from `flats`."""
    leaves = [jnp.zeros(shape, dtype) for shape, dtype in layout.leaves]  # empty leaves travel in no bucket
    for indices, flat in zip(layout.buckets, flats):
        sizes = [math.prod(layout.leaves[i][0]) for i in indices]
        offsets = np.cumsum([0] + sizes)
        for i, start, stop in zip(indices, offsets[:-1], offsets[1:]):
            leaves[i] = flat[start:stop].reshape(layout.leaves[i][0])
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)


def fused(fn, tree, bucket_bytes):
    """`tree` with fn applied to each flat bucket of its packed leaves (fn keeps shape and dtype)."""
    flats, layout = pack(tree, bucket_bytes)
    return unpack([fn(flat) for flat in flats], layout)


LOCAL = ("ring", "lax")  # tree_allreduce's `local`: whose collectives reduce over this process' devices


def tree_allreduce(tree, axis_name, op="sum", *, axis_index_groups=None, bucket_bytes=None, processes=False,
                   timeout=None, wire_dtype=None, local="ring"):
    """allreduce of every leaf of `tree` over `axis_name` (op "sum", "mean", "max" or "min";
    `axis_index_groups`, `processes`, `timeout` and `wire_dtype` as there), one collective per fused
    bucket of at most `bucket_bytes` (default_bucket_bytes() of the default backend when None).

    local="lax" reduces over this process' devices with lax's collectives instead of jaxring's
    ring (lax.psum and pmean; with processes=, lax's psum_scatter and all_gather around jaxring's
    MPI leg): the engine's train.allreduce "psum", op "sum" or "mean" without axis_index_groups.
    """
    if local not in LOCAL:
        raise ValueError(f"tree_allreduce(local={local!r}): the collectives among this process' devices are "
                         f"one of {LOCAL}")
    if local == "ring":
        reduce = functools.partial(allreduce, axis_name=axis_name, op=op, axis_index_groups=axis_index_groups,
                                   processes=processes, timeout=timeout, wire_dtype=wire_dtype)
    elif op not in ("sum", "mean") or axis_index_groups is not None:
        raise ValueError(f"tree_allreduce(local='lax') sums or averages over whole axes: got op={op!r} and "
                         f"axis_index_groups={axis_index_groups!r}; pass local='ring' for those")
    else:
        wire_dtype, timeout_ms = arguments.checked_wire_dtype(wire_dtype, processes), arguments.timeout_ms(timeout)

        def reduce(subtree):
            return jax.tree_util.tree_map(lambda leaf: across_processes.allreduce_with_lax_locally(
                leaf, axis_name, op, processes, wire_dtype, timeout_ms), subtree)

    if jax.lax.axis_size(axis_name) == 1 and processes is False:  # nothing moves, so packing would only copy
        return reduce(tree)
    bucket_bytes = bucket_bytes or default_bucket_bytes()
    # Leaves no trace computed (Python scalars, constants) take no bucket: allreduce sums
    # them as lax does, when traced, to lax's types.
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    traced = [isinstance(leaf, jax.core.Tracer) for leaf in leaves]
    summed = iter(fused(reduce, [leaf for leaf, t in zip(leaves, traced) if t], bucket_bytes))
    constants = iter(reduce([leaf for leaf, t in zip(leaves, traced) if not t]))
    return jax.tree_util.tree_unflatten(treedef, [next(summed) if t else next(constants) for t in traced])
