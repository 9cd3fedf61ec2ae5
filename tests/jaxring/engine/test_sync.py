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
    assert isinstance(sync, sync_lib.InProcessSync)
    out = jax.pmap(sync.mean, axis_name=AXIS, devices=jax.local_devices()[:n_devices])(tree)
    for key, leaf in tree.items():
        expected = np.asarray(leaf, np.float64).mean(0)
        tolerance = 1e-2 if leaf.dtype == jnp.bfloat16 else 1e-6
        for row in np.asarray(out[key], np.float64):  # every replica holds the mean
            np.testing.assert_allclose(row, expected, rtol=tolerance, atol=tolerance)


def test_several_processes_get_the_cross_process_sync():
    sync = sync_lib.make_sync(2, "psum", bucket_bytes=1 << 20)
    assert isinstance(sync, sync_lib.CrossProcessSync) and sync.algorithm == "mpi"
    assert sync_lib.make_sync(4, "ring", bucket_bytes=1 << 20).algorithm == "ring"


@pytest.mark.parametrize("bucket_bytes", [1, 64, 1 << 20])
def test_fused_buckets_round_trip_bitwise(bucket_bytes):
    """What crosses processes: the tree packed into per-dtype buckets inside pmap, unpacked after."""
    tree = random_tree(np.random.default_rng(bucket_bytes), 2)
    fusion = sync_lib._Fusion(bucket_bytes)
    buckets = jax.pmap(fusion.pack, axis_name=AXIS, devices=jax.local_devices()[:2])(tree)
    one_replica = [jnp.asarray(leaf[0]) for leaf in jax.tree_util.tree_leaves(tree)]
    assert len(buckets) == len(plan_buckets(one_replica, bucket_bytes))
    assert all(b.ndim == 2 and b.shape[0] == 2 for b in buckets)
    back = jax.pmap(fusion.unpack, axis_name=AXIS, devices=jax.local_devices()[:2])(buckets)
    for key, leaf in tree.items():
        assert back[key].dtype == leaf.dtype and back[key].shape == leaf.shape
        np.testing.assert_array_equal(np.asarray(back[key]), leaf)
