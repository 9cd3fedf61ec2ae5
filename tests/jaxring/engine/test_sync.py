"""Gradient sync: the strategy picked from the world, means against float64 numpy, fused buckets round trip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.collectives.fusion import plan_buckets
from jaxring.engine import sync as sync_lib
from jaxring.engine.task import AXIS

# Odd shapes, two dtypes and an empty leaf: buckets of 64 bytes split, fuse and skip leaves.
SHAPES = {"w": ((3, 5), np.float32), "b": ((7,), np.float32), "s": ((), np.float32), "h": ((11,), jnp.bfloat16),
          "e": ((0, 4), np.float32), "big": ((33,), np.float32)}


def random_tree(rng, n_devices):
    return {k: rng.normal(size=(n_devices, *shape)).astype(dtype) for k, (shape, dtype) in SHAPES.items()}


@pytest.mark.parametrize("method", ["ring", "psum"])
@pytest.mark.parametrize("n_devices", [3, 4])
def test_in_process_mean_matches_numpy(method, n_devices):
    tree = random_tree(np.random.default_rng(n_devices), n_devices)
    sync = sync_lib.make_sync(1, method, bucket_bytes=64)
    out = jax.pmap(sync.mean, axis_name=AXIS, devices=jax.local_devices()[:n_devices])(tree)
    for key, leaf in tree.items():
        expected = np.asarray(leaf, np.float64).mean(0)
        tolerance = 1e-2 if leaf.dtype == jnp.bfloat16 else 1e-6
        for row in np.asarray(out[key], np.float64):  # every replica holds the mean
            np.testing.assert_allclose(row, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("method", ["ring", "psum"])
@pytest.mark.parametrize("bucket_bytes", [1, 64, 1 << 20])
def test_both_methods_reduce_one_fused_bucket_at_a_time(method, bucket_bytes):
    tree = random_tree(np.random.default_rng(bucket_bytes), 2)
    sync = sync_lib.make_sync(1, method, bucket_bytes=bucket_bytes)
    jaxpr = jax.make_jaxpr(jax.pmap(sync.mean, axis_name=AXIS, devices=jax.local_devices()[:2]))(tree)
    collective = "jaxring_ring" if method == "ring" else "psum"
    count = str(jaxpr).count(f" {collective}[")
    one_replica = [jnp.asarray(leaf[0]) for leaf in jax.tree_util.tree_leaves(tree)]
    assert count == len(plan_buckets(one_replica, bucket_bytes)), str(jaxpr)

