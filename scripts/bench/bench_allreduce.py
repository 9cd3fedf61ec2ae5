"""All-reduce benchmark on the devices of one process: jaxring's allreduce against lax.psum.

Each implementation is timed per op inside a compiled program, as a training
step runs it (scripts/bench/ops_in_program.py): a pmapped program of K chained ops
against the same program of one op, their difference over K - 1. The
program of one op, on the program's argument, is recorded too
(`one_op_program_s`): what a lone call pays, a fresh output included (an
all-reduce sums in place only over values its program computed,
csrc/cpu/cpu_engine.h).

All implementations run in the same process, size by size, their programs
interleaved call by call (one of each per round, in a random order), so the
ratios are measured under the same load. Prints a table and writes JSON records: impl,
n_devices, n_procs, bytes, dtype, ops_per_program, median_s (per op in a
program), algbw_GBps, busbw_GBps, ratio_to_psum (psum's time per op / this
impl's: > 1 means faster than psum), paired_ratio_to_psum (the median over
rounds of the same ratio within each round), one_op_program_s and
one_op_ratio_to_psum.

impl "jaxring" is jaxring.allreduce as it runs by default (on CPU, the
engine's push path up to its threshold, the ring above); with --paths,
"ring", "one_shot" and "push" force each of the CPU engine's paths, which
measures the crossover (csrc/cpu/cpu_engine.h; ring and one-shot read a copy of
an in-place op's input, a copy the default path does not make).

    python scripts/bench/bench_allreduce.py --devices 8 --json runs/bench_allreduce.json
    python scripts/bench/bench_allreduce.py --min-bytes 1K --max-bytes 16M --dtypes float32 --paths
    python scripts/bench/bench_allreduce.py --dtypes float64,int8 --op max   # against lax.pmax

Any dtype jaxring takes (64-bit ones turn on jax_enable_x64). With --op max or min the
baseline is lax.pmax or lax.pmin, recorded under impl "psum" and the ratio_to_psum fields.

Sizes take K/M/G suffixes (binary: 1K = 1024 bytes); each size is 4x the last.
"""

import argparse
import json
import os
import sys
import time

from byte_sizes import parse_bytes
from ops_in_program import BASE_OPS, chained, ops_per_program, per_op, time_in_steady_state


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8, help="host devices on CPU (default 8)")
    parser.add_argument("--min-bytes", type=parse_bytes, default=1 << 10, help="smallest buffer, e.g. 1K (default)")
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 << 20, help="largest buffer, e.g. 64M (default)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, e.g. float32,float64,int8")
    parser.add_argument("--op", choices=("sum", "max", "min"), default="sum", help="allreduce's op (default sum)")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per size and impl")
    parser.add_argument("--paths", action="store_true", help="also time the CPU engine's ring and one-shot paths, forced")
    parser.add_argument("--json", help="write the records here")
    return parser.parse_args()


args = parse_args()
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"

import jax  # noqa: E402  (the device count must be set before jax starts)
import jax.numpy as jnp  # noqa: E402

import jaxring  # noqa: E402
import numpy as np  # noqa: E402

from jaxring.collectives import _ffi  # noqa: E402

CPU_ENGINE = _ffi.cpu_module()
if set(args.dtypes.split(",")) & {"float64", "int64", "uint64", "complex128"}:
    jax.config.update("jax_enable_x64", True)  # the 64-bit types exist only with it


def jaxring_op(x):
    return jaxring.allreduce(x, "i", op=args.op)


# name -> (op, the CPU engine's path while it runs)
IMPLS = {
    "jaxring": (jaxring_op, "auto"),
    "psum": (lambda x: {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}[args.op](x, "i"), "auto"),
}
FORCED_PATHS = {name: (jaxring_op, name) for name in ("ring", "one_shot", "push")}


def bus_bandwidth(nbytes, seconds, n):
    """nccl-tests: algbw = S / t; busbw = algbw * 2(n-1)/n (what each rank moves)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (n - 1) / n


def time_interleaved(programs, x, repeats):
    """Seconds of each timed call of each program (ops_in_program.time_in_steady_state), after an
    untimed call of each, which compiles. `programs`: {key: (function, path)}."""
    def call(fn, path):
        def run():
            CPU_ENGINE.set_cpu_path(CPU_ENGINE.CPU_PATHS[path])
            jax.block_until_ready(fn(x))
        return run

    calls = {key: call(fn, path) for key, (fn, path) in programs.items()}
    for run in calls.values():
        run()
    try:
        return time_in_steady_state(calls, repeats)
    finally:
        CPU_ENGINE.set_cpu_path(CPU_ENGINE.CPU_PATHS["auto"])


def main():
    devices = jax.local_devices()[: args.devices]
    n = len(devices)
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    records = []
    for dtype_name in args.dtypes.split(","):
        dtype = jnp.dtype(dtype_name)
        for nbytes in sizes:
            elements = nbytes // dtype.itemsize
            k = ops_per_program(nbytes)
            repeats = args.repeats
            x = jax.pmap(lambda s: jnp.full((elements,), s, dtype), devices=devices)(
                jnp.arange(1, n + 1).astype(dtype)
            )
            impls = dict(IMPLS, **(FORCED_PATHS if args.paths else {}))
            programs = {(name, ops): (jax.pmap(chained(op, ops), axis_name="i", devices=devices), path)
                        for name, (op, path) in impls.items() for ops in (BASE_OPS, k)}
            times = time_interleaved(programs, x, repeats)
            per_op_s = {name: float(per_op(np.median(times[name, k]), np.median(times[name, BASE_OPS]), k))
                        for name in impls}
            # round by round, so that the paired ratio compares ops timed under the same load
            rounds = {name: per_op(times[name, k], times[name, BASE_OPS], k) for name in impls}
            one_op_s = {name: float(np.median(times[name, BASE_OPS])) for name in impls}
            for impl in impls:
                algbw, busbw = bus_bandwidth(nbytes, per_op_s[impl], n)
                records.append(
                    dict(impl=impl, n_devices=n, n_procs=1, bytes=nbytes, dtype=dtype_name, op=args.op,
                         ops_per_program=k,
                         median_s=per_op_s[impl], algbw_GBps=algbw, busbw_GBps=busbw,
                         ratio_to_psum=per_op_s["psum"] / per_op_s[impl],
                         paired_ratio_to_psum=float(np.median(rounds["psum"] / rounds[impl])),
                         one_op_program_s=one_op_s[impl], one_op_ratio_to_psum=one_op_s["psum"] / one_op_s[impl])
                )
            del x
    print_table(records)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(machine=machine(), method="per op in a program", records=records), f, indent=1)
    return 0


def machine():
    return dict(platform=jax.default_backend(), device_kind=jax.local_devices()[0].device_kind,
                cpu_count=os.cpu_count(), date=time.strftime("%Y-%m-%d"), jax=jax.__version__)


def print_table(records):
    print(f"{'dtype':>8} {'bytes':>10} {'impl':>11} {'ms per op':>10} {'busbw GB/s':>10} {'psum/impl':>9} "
          f"{'paired':>6} {'1-op ms':>9} {'psum/impl':>9}")
    for r in records:
        print(f"{r['dtype']:>8} {r['bytes']:>10} {r['impl']:>11} {r['median_s'] * 1e3:>10.3f} "
              f"{r['busbw_GBps']:>10.3f} {r['ratio_to_psum']:>9.2f} {r['paired_ratio_to_psum']:>6.2f} "
              f"{r['one_op_program_s'] * 1e3:>9.3f} {r['one_op_ratio_to_psum']:>9.2f}")


if __name__ == "__main__":
    sys.exit(main())
