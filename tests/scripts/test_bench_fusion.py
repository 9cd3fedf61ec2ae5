"""scripts/bench/bench_fusion.py: its ways give the float64 mean (the fused buckets bit for bit the per-leaf
ring's), and its --quick run writes a record of every way."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_fusion  # noqa: E402

from jaxring.collectives.fusion import default_bucket_bytes  # noqa: E402
from jaxring.engine.task import AXIS  # noqa: E402

# Buckets of a few of the transformer's small leaves each, its larger leaves alone.
BUCKET_SIZES = (4 << 10,)


def float64_mean(params, noise):
    """The mean over devices of the step's float32 gradients, in float64 (numpy alone)."""
    grads = jax.tree_util.tree_map(lambda p, n: np.float32(0.5) * p + n, params, noise)
    return jax.tree_util.tree_map(lambda g: np.asarray(g, np.float64).mean(axis=0), grads)


def means_of_every_way(devices):
    shapes = bench_fusion.gradient_shapes("transformer")
    params, noise = bench_fusion.random_inputs(shapes, devices, seed=len(devices))
    means = {}
    for way, mean in bench_fusion.sync_ways(BUCKET_SIZES).items():
        program = jax.pmap(lambda p, n, mean=mean: mean(bench_fusion.local_gradients(p, n)), axis_name=AXIS,
                           devices=devices)
        means[way] = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(program(params, noise))]
    return means, jax.tree_util.tree_leaves(float64_mean(params, noise))


@pytest.mark.parametrize("n_devices", [2, 5])
def test_every_way_gives_the_float64_mean_and_fusion_the_per_leaf_rings_bits(n_devices):
    devices = jax.local_devices()[:n_devices]
    means, reference = means_of_every_way(devices)
    assert set(means) == {f"fused:{size}" for size in BUCKET_SIZES} | {"per_leaf_ring", "pmean"}
    for way, leaves in means.items():
        assert [leaf.shape for leaf in leaves] == [(n_devices, *r.shape) for r in reference]
        assert all(leaf.dtype == np.float32 for leaf in leaves)
        for leaf, r in zip(leaves, reference):
            np.testing.assert_allclose(leaf, np.broadcast_to(r, leaf.shape), rtol=2e-6, atol=1e-6, err_msg=way)
        # the CPU engine sums each element over the ranks in rank order, in whichever bucket it lies
        # (csrc/cpu/cpu_engine.h, the push path)
        for leaf, ring_leaf in zip(leaves, means["per_leaf_ring"]):
            if way != "pmean":
                np.testing.assert_array_equal(leaf, ring_leaf, err_msg=way)


def test_quick_run_writes_a_record_of_every_way(tmp_path):
    out = tmp_path / "fusion.json"
    finished = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "bench_fusion.py"), "--quick", "--json", str(out)],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    result = json.loads(out.read_text())
    assert result["command"] == "python scripts/bench/bench_fusion.py --quick --json " + str(out)
    assert {"platform", "cpu_count", "date", "jax"} <= set(result["machine"])
    default = default_bucket_bytes("cpu")
    ways = {r["way"]: r for r in result["records"]}
    assert set(ways) == {f"fused:{default}", "per_leaf_ring", "pmean"}
    assert ways[f"fused:{default}"]["default_bucket"] and ways[f"fused:{default}"]["ratio"] == 1.0
    for r in result["records"]:
        assert (r["tree"], r["n_devices"], r["leaves"]) == ("transformer", 2, 38)
        assert r["step_s"] > 0 and r["error_vs_float64"] < 1e-6
        if r["way"] != "pmean":
            assert r["bitwise_equal_to_per_leaf_ring"], r["way"]
    assert ways["per_leaf_ring"]["collectives"] == 38
