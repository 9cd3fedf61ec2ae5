"""Tensor fusion: a pytree's leaves packed into a few flat buckets, one all-reduce each.

A gradient tree has many small leaves; one ring per leaf would pay the ring's
2(N-1) synchronisation steps per leaf. Packing leaves of one dtype into
buckets of up to `bucket_bytes` pays them once per bucket.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxring import ring

# Small leaves (biases, norms) are fused; leaves of a bucket's size or more
# travel alone, uncopied. On 2 host devices, a 71 MB tree of 3 MB weights
# took 62 ms with 1 MiB buckets against 212 ms with 4 MiB and 122 ms with
# 32 MiB (psum: 52 ms): packing large leaves costs a copy in and a copy out
# and buys nothing. On GPUs, where copies are cheap and each ring op has a
# fixed cost, larger buckets (32-64 MiB) may pay: scripts/bench_cuda_ring.py
# measures ds2_paper's all-reduce per bucket size (not yet run on a GPU).
DEFAULT_BUCKET_BYTES = 1 << 20


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


def tree_allreduce(tree, axis_name, op="mean", bucket_bytes=DEFAULT_BUCKET_BYTES, *, timeout=None):
    """All-reduces every leaf of `tree` over `axis_name` with one ring per fused bucket."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    reduced = list(leaves)
    for indices in plan_buckets(leaves, bucket_bytes):
        flat = jnp.concatenate([leaves[i].reshape(-1) for i in indices])
        total = ring.allreduce(flat, axis_name, op=op, timeout=timeout)
        offsets = np.cumsum([0] + [leaves[i].size for i in indices])
        for i, start, stop in zip(indices, offsets[:-1], offsets[1:]):
            reduced[i] = total[start:stop].reshape(leaves[i].shape)
    return jax.tree_util.tree_unflatten(treedef, reduced)
