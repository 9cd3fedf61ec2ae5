"""A cost model of jaxring's all-reduce schedules, fitted to measurements, and its projection to 1024 GPUs.

    .venv/bin/python scripts/bench/project_scaling.py \\
        --network docs/bench/network-cpu2-2026-11-25.json --plot docs/images/scaling-ds2_paper.png \\
        --json docs/bench/scaling-projection-2026-11-26.json

The schedules (docs/ARCHITECTURE.md):
  ring of p ranks     2(p-1) steps, each moving one chunk (the largest of p near-equal chunks):
                      T = 2(p-1) * (alpha + ceil(S/p) / beta)
  across processes    (collectives/mpi.py) with g devices per node and n nodes: local ring
                      reduce-scatter (g-1 steps), then g concurrent legs across the nodes, one
                      per local device on its S/g shard, sharing the node's NICs, then a local
                      all-gather (g-1 steps); GPU shards go through host memory around MPI.
  the leg             (csrc/mpi/mpi_host_ring.cc) up to mpi.ONE_SHOT_MAX_BYTES one-shot: each node
                      sends its shard to the n-1 others at once, one step:
                      T = alpha + (n-1) S/beta; above, the ring of n ranks.
  buckets             (collectives/fusion.py) one such all-reduce per bucket, one after another.
  overlap             none: the sync runs after the backward pass (engine/sync.py), so the
                      step is compute + all-reduce.

Fits (least squares on each measured point's time): the in-process CPU ring
(docs/bench/allreduce-cpu8-2026-11-25-late-run1.json), the host-staged CUDA ring's
per-call time on one H100 (docs/calibration/h100-2026-11-22.json), the device engine's
ring up to 1 MiB on one H200 (docs/bench/gpu-h200-2026-11-26-run*.json), and, with
--network, the cross-process ring over emulated links and ds2_tiny's
all-reduce there (scripts/bench/cluster/bench_network.py). Then ds2_paper on 8 to
1024 H100s, 8 per node, NVLink inside, 400 Gb/s InfiniBand between.
"""

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench" / "cluster"))

CALIBRATION = ROOT / "docs" / "calibration" / "h100-2026-11-22.json"
CPU_RING = ROOT / "docs" / "bench" / "allreduce-cpu8-2026-11-25-late-run1.json"
# scripts/gpu/bench_cuda_ring.py on one H200, 7 runs (docs/PERFORMANCE.md, "CUDA ring on one GPU").
H200_RUNS = sorted((ROOT / "docs" / "bench").glob("gpu-h200-2026-11-26-run*.json"))
# Virtual ranks share one GPU's memory: above this the device ring's time is that sharing, not a link.
H200_LATENCY_BOUND_BYTES = 1 << 20
MIB = 1 << 20


@dataclass(frozen=True)
class Link:
    """Per ring step: alpha seconds of fixed cost, then bytes at beta bytes/s; per call: `call` seconds."""

    alpha: float
    beta: float
    call: float = 0.0  # launching the collective, whatever its steps (dispatch, the first wait)

    def step(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.beta


# --- the schedules ---------------------------------------------------------------


def chunk_bytes(nbytes: int, p: int, itemsize: int = 4) -> list[int]:
    """The p chunks a ring cuts a buffer into: elements split as evenly as possible (ring_schedule.h)."""
    elements = nbytes // itemsize
    return [(elements // p + (i < elements % p)) * itemsize for i in range(p)]


def ring_step_bytes(nbytes: int, p: int, itemsize: int = 4) -> list[int]:
    """Bytes of the slowest rank's send at each of the 2(p-1) steps: the largest chunk, every step."""
    return [max(chunk_bytes(nbytes, p, itemsize))] * (2 * (p - 1)) if p > 1 else []


def ring_time(nbytes: float, p: int, link: Link) -> float:
    return (link.call if p > 1 else 0.0) + sum(link.step(b) for b in ring_step_bytes(int(nbytes), p))


def leg_terms(nbytes: int, p: int) -> tuple[int, int]:
    """(steps, bytes the busiest link carries one way) of the cross-process leg on a buffer of `nbytes`."""
    from jaxring.collectives.mpi import ONE_SHOT_MAX_BYTES

    if p == 1:
        return 0, 0
    if nbytes <= ONE_SHOT_MAX_BYTES:
        return 1, (p - 1) * nbytes
    return 2 * (p - 1), sum(ring_step_bytes(nbytes, p))


def leg_time(nbytes: float, p: int, link: Link) -> float:
    steps, link_bytes = leg_terms(int(nbytes), p)
    return (link.call if p > 1 else 0.0) + steps * link.alpha + link_bytes / link.beta


def half_ring_time(nbytes: float, p: int, link: Link) -> float:
    """A reduce-scatter or an all-gather alone: p-1 of the ring's steps, and a call."""
    return (ring_time(nbytes, p, link) + (link.call if p > 1 else 0.0)) / 2


@dataclass(frozen=True)
class Platform:
    """How one all-reduce of the project's schedule costs on a machine of nodes with g devices each."""

    name: str
    local: Link  # device to device inside a node
    network: Link  # one cross-node ring step: per-step cost, and one NIC's bandwidth
    nics: int = 1  # per node; the g cross-node rings share them
    staging: Link | None = None  # device <-> host around each MPI step (GPU engines)

    def allreduce(self, nbytes: float, g: int, n: int) -> float:
        if n == 1:
            return ring_time(nbytes, g, self.local)
        shard = math.ceil(nbytes / g)
        rings_per_nic = max(1, g / self.nics)
        cross = Link(self.network.alpha, self.network.beta / rings_per_nic, self.network.call)
        time = leg_time(shard, n, cross)
        if self.staging is not None:  # each step's chunk down to the host and back up
            time += sum(2 * self.staging.step(b) for b in ring_step_bytes(shard, n))
        return half_ring_time(nbytes, g, self.local) + time + half_ring_time(nbytes, g, self.local)


def bucket_sizes(leaf_bytes: list[int], bucket_bytes: int) -> list[int]:
    """Bytes of each bucket of fusion.plan_buckets for float32 leaves of these sizes."""
    from jaxring.collectives.fusion import plan_buckets

    leaves = [np.empty(b // 4, np.float32) for b in leaf_bytes]
    return [sum(leaf_bytes[i] for i in bucket) for bucket in plan_buckets(leaves, bucket_bytes)]


def step_allreduce(platform: Platform, buckets: list[int], g: int, n: int) -> float:
    """The sync of one step: each bucket's all-reduce, one after another."""
    return sum(platform.allreduce(b, g, n) for b in buckets)


# --- NCCL-like baselines: its published tuning model (docs/SCALING.md) ----------------


@dataclass(frozen=True)
class NcclLike:
    """NCCL's latency model for ring and tree all-reduce (Simple protocol) with a bus bandwidth."""

    base_us: float = 8.4
    nvlink_step_us: float = 3.4
    net_step_us: float = 14.0
    tree_nvlink_us: float = 28.0
    busbw: float = 370e9  # 8 x H100 NVSwitch ring, docs/CUDA_RING.md

    def ring(self, nbytes, g, n, nic_Bps, nics) -> float:
        p = g * n
        latency = self.base_us + 2 * (p - n) * self.nvlink_step_us + 2 * (n - 1) * self.net_step_us
        bw = self.busbw if n == 1 else min(self.busbw, nics * nic_Bps)
        return latency * 1e-6 + 2 * (p - 1) / p * nbytes / bw

    def tree(self, nbytes, g, n, nic_Bps, nics) -> float:
        latency = self.base_us + 2 * ((g - 1) * self.nvlink_step_us + math.log2(max(n, 1)) * self.net_step_us)
        bw = self.busbw if n == 1 else min(self.busbw, nics * nic_Bps)
        return latency * 1e-6 + 2 * nbytes / bw


# --- fitting ------------------------------------------------------------------------


def fit_linear(rows, times) -> np.ndarray:
    """Coefficients >= 0 of a time linear in `rows`' terms, minimising the relative error over the points."""
    from scipy.optimize import nnls

    rows, times = np.asarray(rows, float), np.asarray(times, float)
    return nnls(rows / times[:, None], np.ones(len(times)))[0]


def fit_ring(points: list[tuple[int, int, float]], with_call: bool = True) -> Link:
    """call, alpha, beta >= 0 minimising the relative error of ring_time over (bytes, ranks, seconds) points.

    Without several rank counts a call and a step cannot be told apart: then alpha alone.
    """
    with_call = with_call and len({p for _, p, _ in points}) > 1
    rows = [[1.0] * with_call + [2 * (p - 1), sum(ring_step_bytes(b, p))] for b, p, _ in points]
    coef = fit_linear(rows, [t for *_, t in points])
    call = coef[0] if with_call else 0.0
    alpha, inv_beta = coef[-2], max(coef[-1], 1e-15)
    return Link(float(alpha), float(1 / inv_beta), float(call))


def comparison(name, points, predict) -> list[dict]:
    return [{"what": name, "bytes": b, "ranks": p, "measured_s": t, "predicted_s": predict(b, p),
             "error": predict(b, p) / t - 1} for b, p, t in points]


def cpu_ring_points() -> list[tuple[int, int, float]]:
    records = json.loads(CPU_RING.read_text())["records"]
    return [(r["bytes"], r["n_devices"], r["median_s"]) for r in records
            if r["impl"] == "jaxring" and r["dtype"] == "float32"]


def h100_host_staged_points(calibration) -> list[tuple[int, int, float]]:
    """The host-staged engine's per-call time, k virtual ranks on one GPU (float32)."""
    return [(int(r["MiB"] * MIB), r["k"], r["us"] * 1e-6) for r in calibration["latency_us"] if r["dtype"] == "f32"]


def h200_device_ring_points() -> list[tuple[int, int, float]]:
    """The device engine's ring path per call up to H200_LATENCY_BOUND_BYTES, k virtual ranks on
    one H200 (float32, the sizes 4 KiB x 4^i), the median over the runs."""
    times = {}
    for path in H200_RUNS:
        for r in json.loads(path.read_text())["records"]:
            if (r.get("kind") == "per_call" and r["engine"] == "device" and r["path"] == "ring"
                    and r["dtype"] == "float32" and r["bytes"] <= H200_LATENCY_BOUND_BYTES
                    and math.log(r["bytes"] // 4096, 4).is_integer()):
                times.setdefault((r["bytes"], r["ranks"]), []).append(r["device_us"] * 1e-6)
    return [(b, k, float(np.median(t))) for (b, k), t in sorted(times.items())]


# --- the emulated cluster (scripts/bench/cluster/cluster.py) ------------------------------------
# What it adds to a real cluster, which the fit must charge: every node runs on
# one machine (more processes than cores take turns, so each message a process
# handles costs more, and every byte any node moves costs the one CPU), and
# each link is a tc tbf whose bucket lets a burst's first bytes pass at once.


@dataclass(frozen=True)
class EmulatedLink:
    """The leg on the emulated cluster: per call, per message (x processes per core), per byte held
    to the link's rate, per byte moved by all nodes (the one machine's CPU)."""

    call: float
    alpha: float
    beta: float
    machine_beta: float
    cores: int
    burst: float

    def time(self, nbytes: int, p: int, ops: int | None = None) -> float:
        """One op; `ops`: the op measured as bench_allreduce_mpi.py does, in programs of 1 and `ops`
        back-to-back ops after an idle gap that refills the bucket (None: steady state)."""
        coef = (self.call, self.alpha, 1 / self.beta, 1 / self.machine_beta)
        return float(np.dot(coef, emulated_terms(nbytes, p, ops, self.burst, self.cores)))


def emulated_terms(nbytes, p, ops, burst, cores) -> list[float]:
    steps, link_bytes = leg_terms(int(nbytes), p)
    messages = steps if steps != 1 else p - 1  # one-shot: one round, but p - 1 messages to handle
    wire = link_bytes
    if ops is not None:  # (T(ops) - T(1)) / (ops - 1), each program starting with a full bucket
        wire = (max(0.0, ops * link_bytes - burst) - max(0.0, link_bytes - burst)) / (ops - 1)
    turns = max(1.0, p / cores)  # processes per core: each waits its turn for the CPU
    return [turns, messages * turns, wire, p * link_bytes]


def fit_emulated(records, burst: float, cores: int) -> EmulatedLink:
    rows = [emulated_terms(r["bytes"], r["n_procs"], r["ops_per_program"], burst, cores) for r in records]
    call, alpha, inv_beta, inv_machine = fit_linear(rows, [r["median_s"] for r in records])
    return EmulatedLink(float(call), float(alpha), 1 / max(inv_beta, 1e-15), 1 / max(inv_machine, 1e-15),
                        cores, burst)


def network_records(network, rate_bps) -> list[dict]:
    return [r for r in network["allreduce"] if r["impl"] == "jaxring" and r["rate_bps"] == rate_bps]


def emulation_of(network, rate_bps) -> tuple[float, int]:
    """(tbf bucket bytes, cores of the machine) of a bench_network.py run."""
    from cluster import tbf_arguments

    shape = tbf_arguments(rate_bps)
    return float(shape[shape.index("burst") + 1]), int(network["machine"].split("-core")[0])


# The buckets of training records that do not say theirs (docs/bench/network-cpu2-2026-11-25.json's):
# 1 MiB, the CPU default when they ran (fusion.py's is 256 KiB since 2026-11-28).
UNRECORDED_BUCKET_BYTES = 1 << 20


def weak_scaling_checks(network, rate_bps, link: EmulatedLink, leaf_bytes: list[int]) -> list[dict]:
    """ds2_tiny over the emulated nodes: its sync (each bucket's leg, one after another) and its
    step. Weak scaling keeps each node's compute, but here the n nodes' compute shares the one
    machine that a single process already keeps busy: n times the one-node compute, plus the sync."""
    runs = {r["nodes"]: r for r in network["train"] if r["rate_bps"] == rate_bps}
    checks = []
    for n, record in sorted(runs.items()):
        if n == 1 or 1 not in runs:
            continue
        buckets = bucket_sizes(leaf_bytes, record.get("bucket_bytes", UNRECORDED_BUCKET_BYTES))
        sync = sum(link.time(b, n) for b in buckets)
        step = n * (runs[1]["step_s"] - runs[1]["allreduce_s"]) + sync
        for what, measured, predicted in (("sync", record["allreduce_s"], sync), ("step", record["step_s"], step)):
            checks.append({"what": f"ds2_tiny {what}, {rate_bps / 1e9:g} Gbit/s", "bytes": sum(leaf_bytes),
                           "ranks": n, "measured_s": measured, "predicted_s": predicted,
                           "error": predicted / measured - 1})
    return checks


def gradient_leaf_bytes(config_name: str) -> list[int]:
    """Bytes of each parameter leaf of a config (float32), in tree order: what the sync all-reduces."""
    import jax

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.engine.experiment import build_task, load_config

    config = load_config(ROOT / "configs" / f"{config_name}.yaml", [], ROOT)
    task = build_task(config)
    shapes = jax.eval_shape(task.init, jax.random.PRNGKey(0))["params"]
    return [math.prod(leaf.shape) * 4 for leaf in jax.tree_util.tree_leaves(shapes)]


# --- projection --------------------------------------------------------------------------


GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
BUCKETS_MIB = [1, 4, 16, 64, 256]
IB_BPS = 400e9 / 8  # one 400 Gb/s NIC, bytes/s
PCIE_BPS = 50e9  # H100 PCIe Gen5 x16, one direction, an assumed practical figure
NVLINK_BPS = 450e9  # H100 SXM NVLink 4, per direction per GPU
# One cross-node ring step of the project over InfiniBand: an MPI message (a few us
# on 400 Gb/s IB) and the chunk's copies to and from host memory (10 us each, in
# `staging`, counted apart). The emulated network's fitted per-step cost is no
# guide here: it is the kernel's TCP stack over veth on a loaded 2-core CPU.
CROSS_ALPHA_IB = 5e-6


def platforms(calibration, host_staged_local: Link, device_local: Link, cross_alpha: float,
              nics: int) -> dict[str, Platform]:
    """The project's two CUDA engines on H100 nodes; the device engine at its target and as
    measured (`device_local`: its ring's per-step cost on one H200)."""
    staging = Link(10e-6, PCIE_BPS)
    network = Link(cross_alpha, IB_BPS)
    # The device engine at its target: the one-kernel all-reduce's small-size time on 8 virtual
    # ranks (oneshot_floor_us) spread over its 14 ring steps.
    floor = {r["k"]: r["us"] for r in calibration["oneshot_floor_us"] if r["MiB"] < 0.01}
    device_alpha = floor[8] * 1e-6 / 14
    return {
        "host-staged": Platform("host-staged", Link(host_staged_local.alpha, NVLINK_BPS), network, nics, staging),
        "device": Platform("device", Link(device_alpha, NVLINK_BPS), network, nics, staging),
        "device (H200)": Platform("device (H200)", Link(device_local.alpha, NVLINK_BPS), network, nics, staging),
    }


def project(calibration, leaf_bytes, compute_s, host_staged_local, device_local, cross_alpha, nics):
    rows = []
    nccl = NcclLike()
    for name, platform in platforms(calibration, host_staged_local, device_local, cross_alpha, nics).items():
        for mib in BUCKETS_MIB:
            buckets = bucket_sizes(leaf_bytes, mib * MIB)
            for gpus in GPUS:
                ar = step_allreduce(platform, buckets, 8, gpus // 8)
                rows.append(dict(platform=name, bucket_MiB=mib, gpus=gpus, nics=nics, allreduce_s=ar,
                                 step_s=compute_s + ar, efficiency=compute_s / (compute_s + ar),
                                 allreduce_share=ar / (compute_s + ar)))
    total = sum(leaf_bytes)
    for name, cost in (("NCCL ring", nccl.ring), ("NCCL tree", nccl.tree)):
        for gpus in GPUS:
            ar = cost(total, 8, gpus // 8, IB_BPS, nics)
            rows.append(dict(platform=name, bucket_MiB=None, gpus=gpus, nics=nics, allreduce_s=ar,
                             step_s=compute_s + ar, efficiency=compute_s / (compute_s + ar),
                             allreduce_share=ar / (compute_s + ar)))
    return rows


def best_bucket(rows, platform, gpus=128, tolerance=0.05) -> int:
    """The smallest bucket whose step is within `tolerance` of the best at `gpus` (smaller = less memory)."""
    mine = [r for r in rows if r["platform"] == platform and r["gpus"] == gpus]
    best = min(r["step_s"] for r in mine)
    return min(r["bucket_MiB"] for r in mine if r["step_s"] <= best * (1 + tolerance))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--network", type=Path, help="scripts/bench/cluster/bench_network.py's JSON")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--markdown", action="store_true", help="also print the tables of docs/SCALING.md")
    parser.add_argument("--cross-alpha-us", type=float, default=CROSS_ALPHA_IB * 1e6,
                        help="fixed cost of one cross-node ring step over InfiniBand, in us (staging apart)")
    args = parser.parse_args(argv)
    calibration = json.loads(CALIBRATION.read_text())
    checks = []

    cpu_points = cpu_ring_points()
    cpu = fit_ring(cpu_points)
    checks += comparison("CPU in-process ring, 8 host devices", cpu_points, lambda b, p: ring_time(b, p, cpu))
    staged_points = h100_host_staged_points(calibration)
    staged = fit_ring(staged_points)
    checks += comparison("H100 host-staged ring, per call", staged_points, lambda b, p: ring_time(b, p, staged))
    device_points = h200_device_ring_points()
    device = fit_ring(device_points)
    checks += comparison("H200 device engine ring, per call", device_points, lambda b, p: ring_time(b, p, device))
    fits = {"cpu_ring": cpu.__dict__, "h100_host_staged": staged.__dict__, "h200_device_ring": device.__dict__}
    if args.network:
        network = json.loads(args.network.read_text())
        tiny_leaves = gradient_leaf_bytes("ds2_tiny")
        for rate in sorted({r["rate_bps"] for r in network["allreduce"]}):
            records = network_records(network, rate)
            link = fit_emulated(records, *emulation_of(network, rate))
            tcp = [t["bits_per_s"] for t in network["tcp"] if t["rate_bps"] == rate]
            fits[f"network_{rate / 1e9:g}gbit"] = {**link.__dict__, "tcp_stream_Bps": float(np.median(tcp)) / 8}
            checks += [{"what": f"cross-process leg, {rate / 1e9:g} Gbit/s links", "bytes": r["bytes"],
                        "ranks": r["n_procs"], "measured_s": r["median_s"],
                        "predicted_s": (t := link.time(r["bytes"], r["n_procs"], r["ops_per_program"])),
                        "error": t / r["median_s"] - 1} for r in records]
            checks += weak_scaling_checks(network, rate, link, tiny_leaves)
    print(f"{'what':44} {'bytes':>10} {'ranks':>5} {'measured ms':>11} {'model ms':>9} {'error':>7}")
    for c in checks:
        print(f"{c['what']:44} {c['bytes']:>10} {c['ranks']:>5} {c['measured_s'] * 1e3:>11.3f} "
              f"{c['predicted_s'] * 1e3:>9.3f} {100 * c['error']:>6.0f}%")
    within = sum(abs(c["error"]) <= 0.25 for c in checks)
    print(f"{within} of {len(checks)} measured points within 25%\nfits: {json.dumps(fits)}")

    paper = [r for r in calibration["ds2_step_ms"] if r["config"] == "ds2_paper" and r["dtype"] == "bfloat16"
             and r["batch"] == 64 and r["allreduce"] == "ring"][0]
    compute_s = (paper["step_ms"] - paper["ring_of_one_ms"]) * 1e-3
    leaves = gradient_leaf_bytes("ds2_paper")
    rows = [row for nics in (8, 1)
            for row in project(calibration, leaves, compute_s, staged, device, args.cross_alpha_us * 1e-6, nics)]
    print(f"\nds2_paper, bfloat16 batch 64 per GPU, compute {compute_s * 1e3:.1f} ms per step (H100, 2026-11-22), "
          f"gradients {sum(leaves) / 1e6:.0f} MB")
    print(f"{'platform':13} {'NICs':>4} {'bucket':>6} " + " ".join(f"{g:>12}" for g in GPUS))
    for key in sorted({(r["platform"], r["nics"], r["bucket_MiB"] or 0) for r in rows},
                      key=lambda k: (-k[1], k[0], k[2])):
        line = [r for r in rows if (r["platform"], r["nics"], r["bucket_MiB"] or 0) == key]
        cells = " ".join(f"{r['step_s'] * 1e3:6.0f}ms {100 * r['efficiency']:3.0f}%" for r in line)
        print(f"{key[0]:13} {key[1]:>4} {key[2] or '-':>6} {cells}")
    defaults = {p: best_bucket([r for r in rows if r["nics"] == 8], p) for p in ("host-staged", "device", "device (H200)")}
    print(f"bucket within 5% of the best at 128 GPUs (8 NICs per node): {defaults}")
    if args.markdown:
        print(markdown(checks, rows))
    if args.json:
        args.json.write_text(json.dumps({"fits": fits, "checks": checks, "compute_s": compute_s,
                                         "gradient_bytes": sum(leaves), "projection": rows,
                                         "default_buckets_MiB": defaults}, indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot)


def markdown(checks, rows) -> str:
    lines = ["| measured | bytes | ranks | measured ms | model ms | error |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['what']} | {c['bytes']} | {c['ranks']} | {c['measured_s'] * 1e3:.3f} | "
              f"{c['predicted_s'] * 1e3:.3f} | {100 * c['error']:+.0f}% |" for c in checks]
    lines += ["", "| platform | bucket | " + " | ".join(f"{g} GPUs" for g in GPUS) + " |",
              "|---|---:|" + "---:|" * len(GPUS)]
    for platform in ("host-staged", "device", "device (H200)", "NCCL ring", "NCCL tree"):
        for bucket in sorted({r["bucket_MiB"] or 0 for r in rows if r["platform"] == platform}):
            line = [r for r in rows if r["platform"] == platform and (r["bucket_MiB"] or 0) == bucket
                    and r["nics"] == 8]
            cells = " | ".join(f"{r['step_s'] * 1e3:.0f} ms, {100 * r['efficiency']:.0f}% "
                               f"({100 * r['allreduce_share']:.0f}%)" for r in line)
            lines.append(f"| {platform} | {f'{bucket} MiB' if bucket else '-'} | {cells} |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for platform, bucket in (("host-staged", 1), ("host-staged", 64), ("device", 1), ("device", 64),
                             ("device (H200)", 64), ("NCCL ring", None), ("NCCL tree", None)):
        line = [r for r in rows if r["platform"] == platform and r["bucket_MiB"] == bucket and r["nics"] == 8]
        label = platform + (f", {bucket} MiB buckets" if bucket else "")
        axis.plot([r["gpus"] for r in line], [100 * r["efficiency"] for r in line], marker="o", label=label,
                  linestyle="--" if "H200" in platform else "-")  # it lies on the device target's line
    axis.set_xscale("log", base=2)
    axis.set_xlabel("H100 GPUs (8 per node, 8 x 400 Gb/s IB per node)")
    axis.set_ylabel("weak-scaling efficiency, %")
    axis.set_title("ds2_paper, bf16 batch 64 per GPU: model (scripts/bench/project_scaling.py)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
