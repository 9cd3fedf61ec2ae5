"""scripts/bench/bench_step_hosts.py: every way of averaging (the engine's two paths and its sharded step among them) agrees after a step
over three emulated hosts (where the order of additions differs), its record has what docs/PERFORMANCE.md
quotes, and a way that disagrees fails the job."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.faults.network_probes import cluster_lock, skip_reason  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench" / "bench_step_hosts.py"
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_step_hosts  # noqa: E402

REASON = skip_reason()


@pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster: {REASON}")
@pytest.mark.usefixtures("cluster_lock")
def test_three_hosts_agree_and_the_record_has_every_way(tmp_path):
    out = tmp_path / "step.json"
    subprocess.run([sys.executable, str(SCRIPT), "--configs", "examples/classifier/classifier.yaml", "--nodes", "3",
                    "--rates", "10gbit", "--steps", "1", "--rounds", "1", "--json", str(out)],
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=240)
    (record,) = json.loads(out.read_text())["records"]
    assert record["processes"] == 3 and record["local_devices"] == 1 and record["global_batch"] == 24
    assert set(record["step_s"]) == set(bench_step_hosts.WAYS) and all(t > 0 for t in record["step_s"].values())
    assert set(record["allreduce_share"]) == set(bench_step_hosts.SYNCED)
    assert record["check"]["failed"] == []
    assert all(record["check"][way] <= bench_step_hosts.STATE_RTOL for way in bench_step_hosts.SYNCED[1:])
    assert record["rate_bps"] == 10e9 and record["parameters"] == 16 * 64 + 64 + 64 * 4 + 4  # the classifier's MLP
    # adamw's two moments: whole on every device replicated, a third (blocks padded to a multiple) sharded over 3
    state = record["opt_state_bytes_per_device"]
    assert state["jaxring"] == state["engine_mpi4jax"] >= 2 * 4 * record["parameters"]
    assert state["jaxring"] / 3 <= state["sharded"] < state["jaxring"] / 3 + 4096
    assert record["memory_stats"] is None  # JAX's CPU devices give none
    # every way sends: the gradients (at least 2/3 of them by the sharded halves and by the ring), then the rest
    wire = record["wire_bytes_per_step"]
    assert all(wire[way] >= 2 / 3 * record["gradient_bytes"] for way in bench_step_hosts.SYNCED)


def test_a_way_off_by_more_than_the_bound_is_named():
    rng = np.random.default_rng(3)
    state = {"w": rng.normal(size=(5, 7)).astype(np.float32), "count": np.int32(4)}
    off = {"w": state["w"] * (1 + 10 * bench_step_hosts.STATE_RTOL), "count": np.int32(4)}
    close = {"w": np.nextafter(state["w"], np.inf), "count": np.int32(4)}
    result = bench_step_hosts.agreement({"jaxring": state, "lax_gloo": close, "mpi4jax": off})
    assert result["lax_gloo"] <= bench_step_hosts.STATE_RTOL
    assert [f.split(":")[0] for f in result["failed"]] == ["mpi4jax"]
    counted = bench_step_hosts.agreement({"jaxring": state, "lax_gloo": state, "mpi4jax": {**state, "count": np.int32(5)}})
    assert [f.split(":")[0] for f in counted["failed"]] == ["mpi4jax"]  # integers must be equal
