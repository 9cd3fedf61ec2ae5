"""All-reduce and training over emulated network links, with the links' TCP throughput measured in the same run.

    sudo .venv/bin/python scripts/bench/cluster/bench_network.py --nodes 2 3 4 --rates 1gbit 10gbit \\
        --max-bytes 16M --train-nodes 1 2 4 --json docs/bench/network-cpu2-DATE.json

For each rate and node count, on a fresh emulated cluster (cluster.py, one
process and one host device per node): one TCP stream node 0 -> node 1
(tcp_stream.py, the practical limit of a link), then the cross-process
all-reduces of scripts/bench/bench_allreduce_mpi.py (its --job-json mode, run under
this cluster's mpirun: jaxring.allreduce(processes=True) in a jit, a bare
MPI_Allreduce through mpi4py and mpi4jax in a jit; then JAX's gloo psum in a
job of its own, its coordinator on node 0's address). Then, at each of
--train-rates (default: every rate), ds2_tiny weak scaling (scripts/bench/bench_train.py, the same batch per
node) over --train-nodes. busbw = bytes * 2(N-1)/N / time, against the link.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import tcp_stream  # noqa: E402
from byte_sizes import parse_bytes  # noqa: E402
from cluster import Cluster, interrupt_on_termination, parse_rate  # noqa: E402

ALLREDUCE_BENCH = ROOT / "scripts" / "bench" / "bench_allreduce_mpi.py"
TRAIN_BENCH = ROOT / "scripts" / "bench" / "bench_train.py"


def allreduce(cluster, args) -> list[dict]:
    """Each implementation's records; JAX's gloo psum in a job of its own (it needs jax.distributed)."""
    records = []
    for impls in (["jaxring", "mpi_bare", "mpi4jax"], ["jax_gloo"]):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "records.json"
            command = [sys.executable, "-m", "mpi4py", str(ALLREDUCE_BENCH), "--job-json", str(out),
                       "--impls", *impls, "--max-bytes", str(args.max_bytes), "--min-time", str(args.min_time),
                       "--coordinator-host", cluster.addresses[0], *shlex.split(args.allreduce_args)]
            subprocess.run(cluster.mpirun(command), check=True, stdout=subprocess.DEVNULL)
            records += json.loads(out.read_text())
    for r in records:
        n = r["n_devices"]
        r["busbw_GBps"] = r["bytes"] * 2 * (n - 1) / n / r["median_s"] / 1e9
    return records


def train(cluster, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "train.json"
        command = [sys.executable, "-m", "mpi4py", str(TRAIN_BENCH), "--configs", args.train_config, "--allreduce",
                   "ring", "--batch-size", str(args.batch_per_node * cluster.n), "--steps", str(args.train_steps),
                   "--host-devices", "1", "--json", str(out), *(f"--set={o}" for o in args.train_set)]
        subprocess.run(cluster.mpirun(command), check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["records"][0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 3, 4], help="node counts of the all-reduce runs")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    parser.add_argument("--max-bytes", type=parse_bytes, default=16 << 20)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--train-nodes", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--train-rates", nargs="*", help="rates of the weak-scaling runs (default: every --rates)")
    parser.add_argument("--batch-per-node", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--train-config", default="ds2_tiny", help="configs/NAME.yaml of the training runs")
    parser.add_argument("--train-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a config override of the training runs, e.g. train.allreduce_dtype=bfloat16")
    parser.add_argument("--allreduce-args", default="",
                        help="more options for bench_allreduce_mpi.py, e.g. '--piece-bytes 1M'")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.train_rates is None:
        args.train_rates = args.rates
    interrupt_on_termination()
    os.environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    result = {"machine": f"{os.cpu_count()}-core {platform.machine()} CPU, shared with other jobs; emulated links",
              "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
              "command": " ".join(["python", *sys.argv]), "tcp": [], "allreduce": [], "train": []}
    for rate in args.rates:
        for n in args.nodes:
            with Cluster(n, rate) as cluster:
                stream = tcp_stream.measure(cluster, 0, 1)
                result["tcp"].append({"nodes": n, "rate_bps": parse_rate(rate), "bits_per_s": stream["bits_per_s"]})
                print(f"{n} nodes {rate}: TCP stream {stream['bits_per_s'] / 1e9:.3f} Gbit/s", flush=True)
                for r in allreduce(cluster, args):
                    r.update(rate_bps=parse_rate(rate), tcp_bits_per_s=stream["bits_per_s"])
                    result["allreduce"].append(r)
                    print(f"  {r['impl']:8} {r['bytes']:>10} B {r['median_s'] * 1e3:9.2f} ms  busbw "
                          f"{r['busbw_GBps'] * 8:6.3f} Gbit/s = {r['busbw_GBps'] * 8e9 / stream['bits_per_s']:.2f}"
                          " x TCP", flush=True)
        if rate in args.train_rates:
            for n in args.train_nodes:
                with Cluster(n, rate) as cluster:
                    record = train(cluster, args)
                    record.update(rate_bps=parse_rate(rate), nodes=n, config=args.train_config, overrides=args.train_set)
                    result["train"].append(record)
                    print(f"{args.train_config} {' '.join(args.train_set)} {n} nodes {rate}: step {record['step_s'] * 1e3:.0f} ms, all-reduce "
                          f"{record['allreduce_s'] * 1e3:.1f} ms ({100 * record['allreduce_share']:.0f}%)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
