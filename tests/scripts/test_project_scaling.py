"""scripts/project_scaling.py: the cost model's byte counts against a brute-force run of the ring schedule."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import project_scaling as model  # noqa: E402


def simulate_ring(values: np.ndarray, itemsize: int = 4):
    """Runs the ring of docs/ARCHITECTURE.md on rows `values` [p, elements]; returns (results, bytes sent per step)."""
    p, elements = values.shape
    bounds = np.cumsum([0] + [elements // p + (i < elements % p) for i in range(p)])
    chunk = [slice(bounds[i], bounds[i + 1]) for i in range(p)]
    buffers = values.astype(np.float64).copy()
    sent = []
    for s in range(p - 1):  # reduce-scatter: rank r sends chunk (r - s) mod p to r + 1
        moves = [(r, (r - s) % p) for r in range(p)]
        sent.append(max((chunk[c].stop - chunk[c].start) * itemsize for _, c in moves))
        incoming = [(r, c, buffers[r, chunk[c]].copy()) for r, c in moves]
        for r, c, data in incoming:
            buffers[(r + 1) % p, chunk[c]] += data
    for s in range(p - 1):  # all-gather: pass on the complete chunk last received
        moves = [(r, (r + 1 - s) % p) for r in range(p)]
        sent.append(max((chunk[c].stop - chunk[c].start) * itemsize for _, c in moves))
        incoming = [(r, c, buffers[r, chunk[c]].copy()) for r, c in moves]
        for r, c, data in incoming:
            buffers[(r + 1) % p, chunk[c]] = data
    return buffers, sent


@pytest.mark.parametrize("p,elements", [(2, 7), (3, 1), (3, 1001), (4, 4096), (5, 3), (8, 12345), (7, 0)])
def test_the_model_counts_the_bytes_the_ring_schedule_sends(p, elements):
    values = np.random.default_rng(p * 1000 + elements).normal(size=(p, elements))
    results, sent = simulate_ring(values)
    np.testing.assert_allclose(results, np.broadcast_to(values.sum(axis=0), values.shape), rtol=1e-12, atol=1e-12)
    assert model.ring_step_bytes(elements * 4, p) == sent
    assert sum(model.chunk_bytes(elements * 4, p)) == elements * 4


def test_ring_time_is_steps_times_latency_plus_the_largest_chunk_over_bandwidth():
    link = model.Link(alpha=3e-6, beta=2e9)
    nbytes, p = 4 * 1001, 3
    largest = 4 * 334
    assert model.ring_time(nbytes, p, link) == pytest.approx(4 * (3e-6 + largest / 2e9))
    assert model.ring_time(nbytes, 1, link) == 0


def test_the_hierarchical_schedule_is_local_halves_around_the_cross_node_ring():
    local, network = model.Link(1e-6, 100e9), model.Link(5e-6, 10e9)
    platform = model.Platform("x", local, network, nics=2)
    nbytes, g, n = 4 * 8000, 4, 3
    shard = nbytes // g
    # 4 rings share 2 NICs: each gets half of one NIC's bandwidth.
    want = model.ring_time(nbytes, g, local) + model.ring_time(shard, n, model.Link(5e-6, 5e9))
    assert platform.allreduce(nbytes, g, n) == pytest.approx(want)
    assert platform.allreduce(nbytes, g, 1) == pytest.approx(model.ring_time(nbytes, g, local))


def test_buckets_follow_fusion_plan_and_the_fit_recovers_known_constants():
    assert model.bucket_sizes([400, 400, 4000, 400], 1000) == [800, 4000, 400]
    truth = model.Link(7e-5, 3e9, call=2e-4)
    points = [(b, p, model.ring_time(b, p, truth)) for b in (4096, 1 << 20, 16 << 20) for p in (2, 4)]
    fitted = model.fit_ring(points)
    assert (fitted.alpha, fitted.beta, fitted.call) == pytest.approx((truth.alpha, truth.beta, truth.call), rel=1e-6)
