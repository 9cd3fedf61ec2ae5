"""The GPU benchmark's arithmetic, and the whole script on a fake harness (no GPU needed)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from jaxring.collectives import _ffi

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bench_cuda_ring.py"
spec = importlib.util.spec_from_file_location("bench_cuda_ring", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

SEED, REDUCE_FIRST, REDUCE, REDUCE_LAST, COPY = range(5)


def bytes_by_schedule(itemsize, ranks, elements):
    """Bytes read and written by every rank's stages of an all-reduce, counted stage by stage."""
    acc = 4
    total = 0
    for rank in range(ranks):
        for kind, left_is_input, _, _, count, _, _ in _ffi.cpu_module().schedule(
                0, elements, ranks, rank, 1 << 30, 16 // itemsize):
            per_element = {
                SEED: 2 * itemsize,
                REDUCE_FIRST: 2 * itemsize + acc,
                REDUCE: itemsize + 2 * acc,
                REDUCE_LAST: 2 * itemsize + (itemsize if left_is_input else acc),
                COPY: 2 * itemsize,
            }[kind]
            total += per_element * count
    return total


@pytest.mark.parametrize("itemsize", [4, 2])
@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8])
def test_bytes_moved_formula_matches_the_schedule(itemsize, ranks):
    elements = ranks * 16 * 37
    assert bench.ring_bytes_moved(itemsize, ranks, elements) == bytes_by_schedule(itemsize, ranks, elements)
    if itemsize == 4:
        assert bench.ring_bytes_moved(4, ranks, elements) == 5 * (ranks - 1) * 4 * elements or ranks == 1


def test_projection_is_per_call_cost_plus_link_time_per_bucket():
    buckets = [154e6, 3e6]
    expected = sum(12e-6 + 2 * 7 / 8 * b / 450e9 for b in buckets)
    assert bench.project_allreduce_s(buckets, 12e-6) == pytest.approx(expected)
    assert bench.bus_time_s(154e6, 8, 370e9) * 1e3 == pytest.approx(0.7284, rel=1e-3)


class FakeHarness:
    """Per-call times of a made-up GPU: fixed cost + bytes / bandwidth, one-shot cheaper when small."""

    def device_info(self):
        return {"name": "NVIDIA Fake GPU", "sms": 132, "compute_capability": 90, "ring_blocks_per_sm": 2, "max_lanes": 16}

    def copy_times_us(self, nbytes, calls):
        return [2 * nbytes / 3e12 * 1e6] * calls

    def reduce_times_us(self, dtype, elements, calls):
        return [3 * elements * 4 / 2.8e12 * 1e6] * calls

    def launch_floor(self, ranks, calls, warmup):
        return {"device_us": [1.5 * ranks] * calls, "host_us_per_call": 1.2 * ranks}

    def time(self, engine, path, mode, dtype, ranks, elements, slice_bytes, calls, warmup, rotate):
        nbytes = elements * {"float32": 4, "bfloat16": 2}[dtype]
        fixed = 100.0 * ranks if engine == "host" else (2.0 if path == "one_shot" else 5.0) * ranks
        per_byte = (ranks if path == "one_shot" else 2.5) * 1e-6 / 1.0e6 * (ranks - 1)
        device_us = fixed + nbytes * per_byte * 1e6
        return {"device_us": [device_us] * calls, "host_us_per_call": device_us * 1.1, "lanes": 4,
                "one_shot": path == "one_shot"}


def test_the_script_runs_end_to_end_on_a_fake_harness(tmp_path):
    result = bench.run(FakeHarness(), quick=True)
    assert result["launch_floor"][8] == {"device_us": 12.0, "host_us": 9.6}
    assert result["one_shot_crossover_bytes"][8] > 0
    assert result["buckets"], "ds2_paper's buckets"
    total = sum(result["buckets"][0]["bucket_bytes_list"])
    assert 150e6 < total < 160e6  # ds2_paper: 38.5M float32 parameters
    assert all(sum(b["bucket_bytes_list"]) == total for b in result["buckets"])
    assert result["projection"]["projected_ms"] > 2 * 7 / 8 * total / 450e9 * 1e3
    text = bench.markdown(result)
    assert "| 8 | 256 MiB |" in text and "Projection" in text
    json.dumps(result)  # the JSON the script writes
    fake = FakeHarness()
    host = fake.time("host", "auto", 0, "float32", 8, 1024, 0, 1, 0, 1)["host_us_per_call"]
    device = min(fake.time("device", p, 0, "float32", 8, 1024, 0, 1, 0, 1)["host_us_per_call"] for p in ("ring", "one_shot"))
    assert result["targets"]["4KiB_f32_k8_host_speedup>=8"] == pytest.approx(host / device)
    assert np.isfinite(list(v for v in result["targets"].values())).all()
