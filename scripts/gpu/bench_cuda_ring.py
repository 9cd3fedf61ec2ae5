"""CUDA ring benchmarks with k virtual ranks on one GPU (scripts/gpu/gpu_check.sh).

In one run: the device's copy bandwidth and the reduce kernel's; the launch
floor per k (an empty kernel per call from each of k threads); per-call
time of both engines (host-staged "host", device-synchronised "device" on
its ring and one-shot paths) for k = 2, 4, 8 and 4 KiB .. 256 MiB of
float32, device-side (first start to last end over the k streams, CUDA
events) and host-side (wall time per call, rank threads kept alive); the
one-shot/ring crossover per k; tree_allreduce's bucket size for ds2_paper's
gradients; and the projection to 8 GPUs over NVLink. Medians of many calls
after a warm-up, cycling through several buffer sets.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python scripts/gpu/bench_cuda_ring.py --markdown gpu-results/bench.md
"""

import argparse
import datetime
import json
import os
import statistics
import sys

# k kernels that spin on each other from k streams need k hardware queues;
# CUDA reads this once, when it starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

from jaxring.collectives import _ring_call  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB * 4**i for i in range(9)]  # 4 KiB .. 256 MiB
RANKS = (2, 4, 8)
ONE_SHOT_LARGEST = 16 * MIB  # one-shot reads k inputs per rank: beyond this it only loses
BUCKETS = [256 * KIB, MIB, 4 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB, 256 * MIB]
# 8 GPUs of one node, NVLink 4 (H100 SXM): 450 GB/s per direction per GPU.
NVLINK_BYTES_PER_S = 450e9
# NCCL on 8 x H100 (NVSwitch), as quoted in the GPU issue: bus bandwidth of
# the ring and NVLS algorithms, and a small all-reduce timed from the host.
NCCL_RING_BUSBW = 370e9
NCCL_NVLS_BUSBW = 480e9
NCCL_SMALL_CALL_S = (20e-6, 30e-6)
ITEMSIZE = {"float32": 4, "bfloat16": 2}


def ring_bytes_moved(itemsize, ranks, elements):
    """Bytes all ranks read and write in one all-reduce of `elements` by the ring.

    Per element of a chunk, a reduce-scatter step reads the own input and the
    left's input (first step) or float32 partial sum (later steps) and writes
    a float32 partial sum, or the output at the last step; an all-gather step
    reads and writes one element. float32 gives 5(k-1)*S bytes.
    """
    k = ranks
    if k == 1:
        return 2 * itemsize * elements
    acc = 4
    per_element = 0
    for step in range(k - 1):
        left = itemsize if step == 0 else acc
        written = itemsize if step == k - 2 else acc
        per_element += itemsize + left + written
    per_element += (k - 1) * 2 * itemsize
    return per_element * elements  # k ranks x (elements / k) per chunk


def bus_time_s(nbytes, ranks, busbw):
    """nccl-tests' convention: an all-reduce moves 2(k-1)/k of the buffer over each GPU's links."""
    return 2 * (ranks - 1) / ranks * nbytes / busbw


def project_allreduce_s(bucket_bytes, per_call_s, ranks=8, link_bytes_per_s=NVLINK_BYTES_PER_S):
    """Ring all-reduce of buckets of these sizes on `ranks` GPUs of one node.

    Each call pays the measured fixed cost of a call (one kernel, the flag
    hand-offs) plus its bytes over the links: every GPU sends and receives
    2(k-1)/k of the bucket, at `link_bytes_per_s` per direction.
    """
    return sum(per_call_s + bus_time_s(b, ranks, link_bytes_per_s) for b in bucket_bytes)


def median_us(times):
    return statistics.median(times)


def ds2_paper_leaves():
    """ShapeDtypeStructs of ds2_paper's parameters (its gradients have the same)."""
    import jax

    import yaml

    from jaxring.engine import config as config_lib
    from models.deepspeech2.model import ModelConfig, init_variables  # not the task: the GPU image lacks its data packages

    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "ds2_paper.yaml")
    with open(path) as f:
        config = config_lib.section_from_dict(ModelConfig, yaml.safe_load(f)["model"], f"{path}: model")
    return jax.tree.leaves(jax.eval_shape(lambda: init_variables(config, jax.random.key(0)))["params"])


def bucket_plan_bytes(leaves, bucket_bytes):
    from jaxring.collectives.fusion import plan_buckets

    return [sum(leaves[i].size * leaves[i].dtype.itemsize for i in b) for b in plan_buckets(leaves, bucket_bytes)]


class Bench:
    def __init__(self, harness, quick):
        self.harness = harness
        self.quick = quick
        self.records = []

    def calls_for(self, nbytes):
        calls = 200 if nbytes <= MIB else 50 if nbytes <= 16 * MIB else 12
        return max(5, calls // 5) if self.quick else calls

    def per_call(self, engine, path, ranks, nbytes, dtype="float32", mode=0):
        elements = nbytes // ITEMSIZE[dtype]
        calls = self.calls_for(nbytes)
        rotate = 2 if nbytes >= 64 * MIB else 4
        t = self.harness.time(engine, path, mode, dtype, ranks, elements, _ring_call.SLICE_BYTES["cuda"], calls, max(3, calls // 10), rotate)
        record = dict(kind="per_call", engine=engine, path=path if engine == "device" else "ring", ranks=ranks,
                      bytes=nbytes, dtype=dtype, calls=calls, device_us=median_us(t["device_us"]),
                      host_us=t["host_us_per_call"], lanes=t["lanes"], one_shot=t["one_shot"])
        self.records.append(record)
        print(json.dumps(record), flush=True)
        return record


def run(harness, quick, ranks_list=RANKS, sweep_buckets=True):
    """Every measurement; ranks_list must hold 2 and 8 (the targets' ring sizes)."""
    bench = Bench(harness, quick)
    device = harness.device_info()
    copy_bytes = 256 * MIB
    copy_us = median_us(harness.copy_times_us(copy_bytes, 20))
    copy_bw = 2 * copy_bytes / (copy_us * 1e-6)  # read + write
    reduce_bw = {}
    for dtype in ("float32", "bfloat16"):
        elements = copy_bytes // ITEMSIZE[dtype]
        us = median_us(harness.reduce_times_us(dtype, elements, 20))
        reduce_bw[dtype] = 3 * copy_bytes / (us * 1e-6)
    print(f"copy {copy_bw / 1e9:.0f} GB/s, reduce {reduce_bw['float32'] / 1e9:.0f} GB/s (f32)", flush=True)
    # k threads launching onto one GPU, with nothing to do: the floor under every per-call time below.
    launch_floor = {}
    for ranks in ranks_list:
        t = harness.launch_floor(ranks, bench.calls_for(4 * KIB), 10)
        launch_floor[ranks] = dict(device_us=median_us(t["device_us"]), host_us=t["host_us_per_call"])
        print(f"launch floor, k={ranks}: {launch_floor[ranks]}", flush=True)

    table = {}
    for ranks in ranks_list:
        for nbytes in SIZES:
            table[("host", ranks, nbytes)] = bench.per_call("host", "auto", ranks, nbytes)
            table[("ring", ranks, nbytes)] = bench.per_call("device", "ring", ranks, nbytes)
            if nbytes <= ONE_SHOT_LARGEST:
                table[("one_shot", ranks, nbytes)] = bench.per_call("device", "one_shot", ranks, nbytes)
    bf16 = bench.per_call("device", "ring", 8, 256 * MIB, dtype="bfloat16")
    bf16_host = bench.per_call("host", "auto", 8, 256 * MIB, dtype="bfloat16")

    crossover = {}
    for ranks in ranks_list:
        # The largest size at which one-shot still beats the ring (device-side).
        wins = [n for n in SIZES if ("one_shot", ranks, n) in table
                and table[("one_shot", ranks, n)]["device_us"] < table[("ring", ranks, n)]["device_us"]]
        crossover[ranks] = max(wins) if wins else 0

    def best_device_us(ranks, nbytes):
        candidates = [table[(p, ranks, nbytes)]["device_us"] for p in ("ring", "one_shot") if (p, ranks, nbytes) in table]
        return min(candidates)

    buckets = bucket_sweep(bench, crossover) if sweep_buckets else []
    per_call_s = best_device_us(8, 4 * KIB) * 1e-6
    best_bucket = min(buckets, key=lambda b: b["measured_ms"]) if buckets else None
    projection = None
    if best_bucket is not None:
        sizes = best_bucket["bucket_bytes_list"]
        total = sum(sizes)
        projection = dict(
            bucket_bytes=best_bucket["bucket_bytes"], buckets=len(sizes), gradient_bytes=total,
            per_call_us=per_call_s * 1e6, link_GBps=NVLINK_BYTES_PER_S / 1e9,
            projected_ms=project_allreduce_s(sizes, per_call_s) * 1e3,
            nccl_ring_ms=bus_time_s(total, 8, NCCL_RING_BUSBW) * 1e3,
            nccl_nvls_ms=bus_time_s(total, 8, NCCL_NVLS_BUSBW) * 1e3,
        )
    f32_256 = table[("ring", 8, 256 * MIB)]
    targets = {
        "4KiB_f32_k8_device_us<=40": best_device_us(8, 4 * KIB),
        "4KiB_f32_k2_device_us<=20": best_device_us(2, 4 * KIB),
        "4KiB_f32_k8_host_speedup>=8": table[("host", 8, 4 * KIB)]["host_us"]
        / min(table[(p, 8, 4 * KIB)]["host_us"] for p in ("ring", "one_shot")),
        "256MiB_f32_k8_copy_fraction>=0.85": ring_bytes_moved(4, 8, 64 * MIB) / (f32_256["device_us"] * 1e-6) / copy_bw,
        "256MiB_bf16_k8_copy_fraction>=0.80": ring_bytes_moved(2, 8, 128 * MIB) / (bf16["device_us"] * 1e-6) / copy_bw,
        "ds2_paper_projected_ms<=2": projection["projected_ms"] if projection else None,
    }
    return dict(device=device, copy_GBps=copy_bw / 1e9, reduce_GBps={k: v / 1e9 for k, v in reduce_bw.items()},
                launch_floor=launch_floor, records=bench.records, one_shot_crossover_bytes=crossover, buckets=buckets,
                projection=projection, targets=targets, bf16_256MiB_k8=dict(device=bf16, host=bf16_host))


def bucket_sweep(bench, crossover):
    """ds2_paper's gradient all-reduce at 8 virtual ranks per bucket size: the sum of the
    measured per-call times of its buckets (device engine, the path each size takes)."""
    try:
        leaves = ds2_paper_leaves()
    except Exception as e:  # noqa: BLE001  the sweep needs the model code; the rest does not
        print(f"bucket sweep skipped: ds2_paper's parameters could not be built ({e!r})", flush=True)
        return []
    measured = {}
    results = []
    for bucket in BUCKETS:
        sizes = bucket_plan_bytes(leaves, bucket)
        total_us = 0.0
        for nbytes in sizes:
            key = nbytes
            if key not in measured:
                path = "one_shot" if nbytes <= crossover[8] else "ring"
                measured[key] = bench.per_call("device", path, 8, max(nbytes, 4), mode=0)["device_us"]
            total_us += measured[key]
        results.append(dict(bucket_bytes=bucket, buckets=len(sizes), measured_ms=total_us / 1e3,
                            bucket_bytes_list=sizes))
        print(f"bucket {bucket / MIB:g} MiB: {len(sizes)} calls, {total_us / 1e3:.2f} ms", flush=True)
    return results


def human(nbytes):
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def markdown(result):
    lines = [f"Device: {result['device']['name']}; copy {result['copy_GBps']:.0f} GB/s; "
             f"reduce kernel {result['reduce_GBps']['float32']:.0f} GB/s (f32).", "",
             "| k | bytes | host-staged dev us | host-staged host us | device ring dev us | device ring host us "
             "| one-shot dev us | one-shot host us |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = {}
    for r in result["records"]:
        if r["kind"] == "per_call" and r["dtype"] == "float32":
            rows.setdefault((r["ranks"], r["bytes"]), {})[r["engine"] + "/" + r["path"]] = r
    for (ranks, nbytes), row in sorted(rows.items()):
        if nbytes not in SIZES:
            continue  # bucket-sweep sizes

        def cell(name, field, row=row):
            return f"{row[name][field]:.1f}" if name in row else "-"

        lines.append(f"| {ranks} | {human(nbytes)} | {cell('host/ring', 'device_us')} | {cell('host/ring', 'host_us')} "
                     f"| {cell('device/ring', 'device_us')} | {cell('device/ring', 'host_us')} "
                     f"| {cell('device/one_shot', 'device_us')} | {cell('device/one_shot', 'host_us')} |")
    lines += ["", "Launch floor (an empty kernel per call from each of k threads, the same events): "
              + ", ".join(f"k={k}: {v['device_us']:.1f} dev us, {v['host_us']:.1f} host us"
                          for k, v in result["launch_floor"].items())]
    lines += ["", "One-shot beats the ring up to (bytes, per k): "
              + ", ".join(f"k={k}: {v}" for k, v in result["one_shot_crossover_bytes"].items()), ""]
    lines += ["| bucket | calls | ds2_paper all-reduce ms (k=8, sum of measured calls) |", "|---:|---:|---:|"]
    for b in result["buckets"]:
        lines.append(f"| {human(b['bucket_bytes'])} | {b['buckets']} | {b['measured_ms']:.2f} |")
    p = result["projection"]
    if p:
        lines += ["", f"Projection, 8 GPUs, NVLink {p['link_GBps']:.0f} GB/s per direction, {p['buckets']} buckets "
                  f"of at most {human(p['bucket_bytes'])} ({p['gradient_bytes'] / 1e6:.1f} MB): "
                  f"sum over buckets of ({p['per_call_us']:.1f} us + 2*7/8 * bytes / 450 GB/s) = "
                  f"{p['projected_ms']:.2f} ms; NCCL at its published bus bandwidth: ring {p['nccl_ring_ms']:.2f} ms, "
                  f"NVLS {p['nccl_nvls_ms']:.2f} ms."]
    lines += ["", "| target | measured |", "|---|---:|"]
    for name, value in result["targets"].items():
        lines.append(f"| {name} | {'-' if value is None else f'{value:.3g}'} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-dir", default="docs/bench", help="writes gpu-<device>-<date>.json here")
    parser.add_argument("--markdown", help="also write the tables here")
    parser.add_argument("--quick", action="store_true", help="fewer calls per size (a smoke run)")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)), help="ring sizes to time; must include 2 and 8")
    parser.add_argument("--no-buckets", action="store_true", help="skip ds2_paper's bucket sweep and projection")
    args = parser.parse_args()
    ranks_list = tuple(int(k) for k in args.ranks.split(","))
    if not {2, 8} <= set(ranks_list):
        parser.error(f"--ranks {args.ranks}: the targets need k=2 and k=8")
    from jaxring.collectives import _jaxring_cuda_harness as harness

    result = run(harness, args.quick, ranks_list, not args.no_buckets)
    result["date"] = datetime.date.today().isoformat()
    result["command"] = " ".join(sys.argv)
    device = result["device"]["name"].lower().replace("nvidia ", "").split()[0]
    os.makedirs(args.json_dir, exist_ok=True)
    path = os.path.join(args.json_dir, f"gpu-{device}-{result['date']}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    table = markdown(result)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
