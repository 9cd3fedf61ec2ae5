"""scripts/bench/project_scaling.py: the cost model's byte counts against a brute-force run of the ring schedule."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))

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
    nbytes, g, n = 4 * 80000, 4, 3  # shards above mpi.ONE_SHOT_MAX_BYTES: the leg is a ring
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


def test_the_leg_is_one_shot_up_to_the_threshold_and_the_ring_above():
    from jaxring.collectives.mpi import ONE_SHOT_MAX_BYTES

    link = model.Link(alpha=2e-5, beta=1e8, call=1e-4)
    small, large, p = ONE_SHOT_MAX_BYTES - 12, ONE_SHOT_MAX_BYTES + 4 * 7, 3
    # one-shot: every node sends its whole buffer to each of the p-1 others, in one step
    assert model.leg_time(small, p, link) == pytest.approx(1e-4 + 2e-5 + (p - 1) * small / 1e8)
    assert model.leg_time(large, p, link) == pytest.approx(model.ring_time(large, p, link))
    assert model.leg_time(large, 1, link) == 0
    points = [(b, q, model.leg_time(b, q, link)) for b in (4096, small, large, 1 << 22) for q in (2, 4)]
    call, alpha, inv_beta = model.fit_linear([[1.0, *model.leg_terms(b, q)] for b, q, _ in points], [t for *_, t in points])
    assert (alpha, 1 / inv_beta, call) == pytest.approx((link.alpha, link.beta, link.call), rel=1e-6)


def test_the_emulated_link_charges_the_tbf_bucket_the_shared_cores_and_the_machine():
    burst, cores = 250_000.0, 2
    # one-shot 16 KiB over 2 nodes, 21 ops after an idle gap: the bucket holds 15 of them
    terms = model.emulated_terms(16384, 2, 21, burst, cores)
    assert terms == pytest.approx([1.0, 1.0, (21 * 16384 - burst) / 20, 2 * 16384])
    assert model.emulated_terms(4096, 2, 3, burst, cores)[2] == 0  # all within the bucket
    assert model.emulated_terms(1 << 24, 4, None, burst, cores)[2] == model.leg_terms(1 << 24, 4)[1]
    # 4 processes on 2 cores: every call and each of the one-shot's 3 messages take turns
    assert model.emulated_terms(4096, 4, None, burst, cores)[:2] == [2.0, 6.0]
    truth = model.EmulatedLink(call=3e-5, alpha=1e-5, beta=1.2e8, machine_beta=2e9, cores=cores, burst=burst)
    records = [{"bytes": b, "n_procs": p, "ops_per_program": k, "median_s": truth.time(b, p, k)}
               for b, k in ((4096, 21), (65536, 21), (1 << 20, 5), (1 << 24, 3)) for p in (2, 3, 4)]
    fitted = model.fit_emulated(records, burst, cores)
    assert (fitted.call, fitted.alpha, fitted.beta, fitted.machine_beta) == pytest.approx(
        (truth.call, truth.alpha, truth.beta, truth.machine_beta), rel=1e-6)


def test_weak_scaling_is_n_times_the_shared_compute_plus_the_buckets_one_after_another():
    link = model.EmulatedLink(call=3e-5, alpha=1e-5, beta=1.2e8, machine_beta=2e9, cores=2, burst=250_000.0)
    leaves = [3 << 20, 1000 * 4, 700 << 10]
    network = {"train": [{"nodes": 1, "rate_bps": 1e9, "step_s": 0.1, "allreduce_s": 0.002},
                         {"nodes": 4, "rate_bps": 1e9, "step_s": 0.5, "allreduce_s": 0.05}]}
    sync, step = model.weak_scaling_checks(network, 1e9, link, leaves)
    buckets = model.bucket_sizes(leaves, model.UNRECORDED_BUCKET_BYTES)  # the network records say none
    assert sync["predicted_s"] == pytest.approx(sum(link.time(b, 4) for b in buckets))
    assert step["predicted_s"] == pytest.approx(4 * 0.098 + sync["predicted_s"])
    assert step["error"] == pytest.approx(step["predicted_s"] / 0.5 - 1)
