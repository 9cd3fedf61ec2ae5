"""Gradient sync: the strategy picked from the world, means against float64 numpy, fused buckets round trip."""

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.collectives.fusion import plan_buckets
from jaxring.engine import sync as sync_lib
from jaxring.engine.task import AXIS
from tests.tiny_runs import finish, mpirun

# Odd shapes, two dtypes and an empty leaf: buckets of 64 bytes split, fuse and skip leaves; "ring" is
# large enough for the MPI leg's ring (csrc/mpi/mpi_host_ring.cc) rather than its one-shot.
SHAPES = {"w": ((3, 5), np.float32), "b": ((7,), np.float32), "s": ((), np.float32), "h": ((11,), jnp.bfloat16),
          "e": ((0, 4), np.float32), "big": ((33,), np.float32), "ring": ((60001,), np.float32)}


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


def test_mean_over_two_processes_matches_numpy():
    """Both methods across processes (psum: lax locally, the MPI leg across), with float32 and with
    bfloat16 on the wire (train.allreduce_dtype): numbers, against float64 numpy."""
    n_procs, n_devices = 2, 3
    labels = ("psum", "ring", "ring:bfloat16", "psum:bfloat16")
    worker = Path(__file__).with_name("sync_worker.py")
    code, output = finish(mpirun(n_procs, [worker, *labels], with_mpi4py=True, devices_per_proc=n_devices), 240)
    assert code == 0, output
    draws = [random_tree(np.random.default_rng(rank), n_devices) for rank in range(n_procs)]  # as sync_worker.py
    means = {}
    for label in labels:
        for key, (shape, dtype) in SHAPES.items():
            every = np.concatenate([np.asarray(draw[key], np.float64) for draw in draws])
            expected = every.mean(0)
            # bfloat16 on the wire: each process' local sum rounded to bfloat16 (at most 2^-8 of it:
            # 8 significant bits) and the one-shot leg's total rounded once more: over the N devices,
            # within 2^-8 (sum of |x| + |sum of x|) / N <= 2^-7 of the mean of |x|.
            wire = 2.0**-7 * np.abs(every).mean(0) if label.endswith("bfloat16") else 0.0
            tolerance = 1e-2 if dtype == jnp.bfloat16 else 1e-6
            for rank in range(n_procs):
                found = re.search(rf"^rank {rank} {label} {key} (\[.*\])$", output, re.MULTILINE)
                assert found, f"rank {rank} printed no {label} mean of {key}:\n{output}"
                got = np.array(json.loads(found[1]), np.float64).reshape(shape)
                assert (np.abs(got - expected) <= wire + tolerance * (1 + np.abs(expected))).all(), (label, key)
                means[label, key] = got
    # The wire's rounding shows: float32 leaves of several elements differ from the float32 wire's.
    assert not np.array_equal(means["ring:bfloat16", "big"], means["ring", "big"])
    assert not np.array_equal(means["ring:bfloat16", "ring"], means["ring", "ring"])
