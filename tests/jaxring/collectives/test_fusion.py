"""Tensor fusion: buckets are planned by dtype and size, and unfused exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxring
from jaxring.collectives.fusion import default_bucket_bytes, plan_buckets


def test_buckets_keep_dtypes_apart_respect_the_size_and_skip_empty_leaves():
    leaves = [
        np.zeros(10, np.float32),  # 40 B
        np.zeros(4, jnp.bfloat16),  # 8 B
        np.zeros(20, np.float32),  # 80 B: 40 + 80 > 100, new bucket
        np.zeros(0, np.float32),
        np.zeros(100, np.float32),  # 400 B: bigger than a bucket, alone
        np.zeros(3, jnp.bfloat16),
    ]
    assert plan_buckets(leaves, bucket_bytes=100) == [[0], [1, 5], [2], [4]]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(leaves, bucket_bytes=0)


def test_a_bucket_fills_to_exactly_its_size_and_one_byte_is_a_valid_size():
    leaves = [np.ones(4, np.float32), np.ones(2, np.float32), np.ones(2, np.float32)]  # 16, 8, 8 B
    assert plan_buckets(leaves, bucket_bytes=16) == [[0], [1, 2]]  # 8 + 8 fills the second to 16 B
    assert plan_buckets(leaves[1:], bucket_bytes=16) == [[0, 1]]  # and the first one
    assert plan_buckets(leaves, bucket_bytes=1) == [[0], [1], [2]]


@pytest.mark.parametrize("ranks", (1, 3))  # one: no ring, no packing
@pytest.mark.parametrize("bucket_bytes", (16, 1000, 1 << 25))
def test_tree_allreduce_equals_a_mean_per_leaf(bucket_bytes, ranks):
    rng = np.random.default_rng(bucket_bytes)
    tree = {
        "dense": {"kernel": rng.standard_normal((ranks, 7, 5)).astype(np.float32), "bias": rng.standard_normal((ranks, 5)).astype(np.float32)},
        "scalar": rng.standard_normal((ranks,)).astype(np.float32),
        "half": rng.standard_normal((ranks, 9)).astype(jnp.bfloat16),
        "empty": np.zeros((ranks, 0), np.float32),
        "count": rng.integers(0, 9, (ranks, 4)).astype(np.int32),
    }
    reduced = jax.pmap(
        lambda t: jaxring.tree_allreduce({k: v for k, v in t.items() if k != "count"}, "i", "mean", bucket_bytes=bucket_bytes)
        | {"count": jaxring.tree_allreduce(t["count"], "i", op="sum", bucket_bytes=bucket_bytes)},
        axis_name="i",
        devices=jax.devices()[:ranks],
    )(tree)
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        out = np.asarray(_at(reduced, path))
        expected = np.asarray(leaf, np.float64)
        expected = expected.sum(0) if path[0].key == "count" else expected.mean(0)
        tol = 1e-2 if leaf.dtype == jnp.bfloat16 else 1e-5
        assert out.shape == leaf.shape and out.dtype == leaf.dtype
        np.testing.assert_allclose(np.asarray(out[-1], np.float64), expected, rtol=tol, atol=tol)


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def test_tree_allreduce_without_op_sums_as_psum():
    rng = np.random.default_rng(5)
    tree = {"w": rng.standard_normal((3, 4, 3)).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float32)}
    run = lambda reduce: jax.pmap(reduce, axis_name="i", devices=jax.devices()[:3])(tree)  # noqa: E731
    default = run(lambda t: jaxring.tree_allreduce(t, "i", bucket_bytes=16))
    psum = run(lambda t: jax.lax.psum(t, "i"))
    for name in tree:
        np.testing.assert_allclose(default[name], psum[name], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(default[name][0], np.float64), tree[name].astype(np.float64).sum(0), rtol=1e-5)


@pytest.mark.parametrize("op, lax_op", [("max", jax.lax.pmax), ("min", jax.lax.pmin), ("sum", jax.lax.psum)])
def test_tree_allreduce_by_groups_and_max_min_as_lax(op, lax_op):
    """Fused buckets reduce elementwise, so max and min fuse as sums do; groups reach every bucket's ring."""
    rng = np.random.default_rng([6, len(op)])
    tree = {"w": rng.standard_normal((4, 5, 3)).astype(np.float32), "b": rng.standard_normal((4, 7)).astype(np.float32),
            "n": rng.integers(-50, 50, (4, 3)).astype(np.int32)}
    if op != "sum":
        tree["w"][1, ::2] = np.nan  # lax's CPU max/min skip a NaN where the group has another value
    groups = [[0, 3], [2, 1]]
    run = lambda reduce: jax.pmap(reduce, axis_name="i", devices=jax.devices()[:4])(tree)  # noqa: E731
    fused = run(lambda t: jaxring.tree_allreduce(t, "i", op, axis_index_groups=groups, bucket_bytes=64))
    expected = run(lambda t: lax_op(t, "i", axis_index_groups=groups))
    for name in tree:
        np.testing.assert_array_equal(np.asarray(fused[name]).view(np.uint8), np.asarray(expected[name]).view(np.uint8))


def test_the_default_bucket_size_is_the_platforms():
    assert default_bucket_bytes("cpu") == 256 << 10
    assert default_bucket_bytes("gpu") == 64 << 20
    assert default_bucket_bytes() == default_bucket_bytes(jax.default_backend())
    with pytest.raises(ValueError, match="no default bucket size for platform 'tpu'.*pass bucket_bytes"):
        default_bucket_bytes("tpu")


def test_tree_allreduce_fuses_into_buckets_of_the_platform_default():
    # 6 float32 leaves of 100 KiB: 256 KiB buckets (the CPU's) hold 2 each; the GPU's 64 MiB would hold all 6.
    leaves = [np.random.default_rng(i).standard_normal((2, 25 * 1024)).astype(np.float32) for i in range(6)]
    jaxpr = jax.make_jaxpr(jax.pmap(lambda t: jaxring.tree_allreduce(t, "i", "sum"), axis_name="i", devices=jax.devices()[:2]))(leaves)
    expected = len(plan_buckets([leaf[0] for leaf in leaves], default_bucket_bytes("cpu")))
    assert expected == 3
    assert str(jaxpr).count(" jaxring_ring[") == expected, str(jaxpr)


def test_tree_allreduce_refuses_a_wire_dtype_as_allreduce_does():
    leaves = {"w": np.ones((2, 3), np.float32)}
    for local in ("ring", "lax"):
        with pytest.raises(ValueError, match="is the dtype of what crosses processes; pass processes=True"):
            jax.pmap(lambda t: jaxring.tree_allreduce(t, "i", "mean", wire_dtype="bfloat16", local=local), "i",
                     devices=jax.devices()[:2])(leaves)
        with pytest.raises(ValueError, match=r"the chunks cross processes as one of \('bfloat16'"):
            jax.pmap(lambda t: jaxring.tree_allreduce(t, "i", "mean", wire_dtype="int8", processes=True, local=local),
                     "i", devices=jax.devices()[:2])(leaves)


def test_tree_allreduce_with_lax_locally_is_lax_per_bucket_and_refuses_what_it_does_not_take():
    """local="lax" (the engine's train.allreduce "psum"): in one process, lax.pmean of each fused bucket."""
    rng = np.random.default_rng(7)
    tree = {"w": rng.standard_normal((3, 4, 5)).astype(np.float32), "b": rng.standard_normal((3, 7)).astype(np.float32)}
    jaxpr = jax.make_jaxpr(jax.pmap(lambda t: jaxring.tree_allreduce(t, "i", "mean", bucket_bytes=1 << 20, local="lax"),
                                    axis_name="i", devices=jax.devices()[:3]))(tree)
    assert str(jaxpr).count(" psum[") == 1 and "jaxring_ring" not in str(jaxpr), str(jaxpr)
    got = jax.pmap(lambda t: jaxring.tree_allreduce(t, "i", "mean", bucket_bytes=1, local="lax"), "i",
                   devices=jax.devices()[:3])(tree)
    want = jax.pmap(lambda t: jax.lax.pmean(t, "i"), "i", devices=jax.devices()[:3])(tree)
    for name in tree:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))
    for options, refused in (({"local": "nccl"}, r"local='nccl'"), ({"op": "max", "local": "lax"}, "op='max'"),
                             ({"axis_index_groups": [[0], [1], [2]], "local": "lax"}, "axis_index_groups")):
        with pytest.raises(ValueError, match=refused):
            jax.pmap(lambda t: jaxring.tree_allreduce(t, "i", **options), "i", devices=jax.devices()[:3])(tree)
