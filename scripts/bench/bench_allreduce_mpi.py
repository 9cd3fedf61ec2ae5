"""All-reduce across processes: jaxring's in-jit op vs bare MPI_Allreduce vs mpi4jax vs JAX's gloo psum.

Run it without mpirun; it launches the mpirun jobs itself:

    python scripts/bench/bench_allreduce_mpi.py --procs 2 4 [--devices-per-proc 1]
        [--max-bytes 64M] [--dtype float32] [--json OUT]

For each process count, buffers of --dtype (float32, or float64 as scientific codes sum)
of 4 KiB .. --max-bytes per device, it times

    jaxring   K chained jaxring.allreduce(processes=True) in one pmapped jit (local
              ring, MPI ring of processes, local ring), per op: the program's time
              less that of the same program with one all-reduce, over K - 1
    mpi_bare  MPI_Allreduce of a numpy buffer of `bytes` through mpi4py, one per
              process: the baseline (with several devices per process, the
              cross-process part alone)
    mpi4jax   K chained mpi4jax.allreduce in one jit, one device per process,
              per op as for jaxring
    jaxring_jit  the same program with jaxring.allreduce(a, (), processes=True) in place of
              mpi4jax's: the MPI leg alone, in plain jit, as mpi4jax's users call it
    jax_gloo  K chained jax.lax.psum over the global mesh (jax.distributed, gloo CPU
              collectives) in one jit, per op as for jaxring, in a job of its own
    jaxring_global  the same program with jaxring.allreduce in place of lax.psum
              (an axis spanning jax.distributed processes: local ring, MPI leg,
              local ring), in jax_gloo's job

--sizes 8 64 4K 64K times those sizes instead of 4 KiB .. --max-bytes (8 B: one float64, a
dot product's). --busy-poll leaves Open MPI's waiting processes spinning (its default) instead of
yielding the core (--mca mpi_yield_when_idle 1, this script's default); records carry `polling`.
--cg times a CG-shaped loop instead: 200 iterations (--cg-iterations) of a 64x64 float64 block per
process (--cg-side), each with a 5-point stencil on the block and two scalar sum reductions across
processes, in one jit, by jaxring.mpi4jax.allreduce (cg_jaxring) and mpi4jax.allreduce (cg_mpi4jax),
alternated; records carry median_s per solve and paired_speedup_vs_mpi4jax (median over rounds of
mpi4jax's time over jaxring's).

Each time is the slowest rank's, median over interleaved rounds (each
timed call right after an untimed call of the same program, as a training
loop runs its step). Records carry
impl, n_devices, n_procs, bytes (per device), dtype, median_s (per op),
algbw_GBps, busbw_GBps = algbw * 2(N-1)/N with N = n_devices, and
speedup_vs_mpi_allreduce (mpi_bare's time / this time, same process count and
size) and paired_speedup_vs_mpi_allreduce (the median over rounds of the same
ratio within each round; only where mpi_bare ran in the same job). `launch(parse_args([...]))` and `run_job` are the entry points;
--mpirun-args passes options to mpirun (e.g. "--mca btl tcp,self" to cross
processes over TCP, as on an emulated network); --one-shot-max-bytes and
--piece-bytes and --doubling-max-bytes set the MPI leg's algorithm limits (jaxring/collectives/mpi.py),
--leg-spin-us how long each of its waits polls MPI before yielding the core (csrc/mpi/mpi_host_ring.cc)
and --leg-patience-us how long a leg may wait at a time on XLA's thread before
a task thread takes it over (csrc/mpi/cpu_mpi_ring.cc), for the run; jaxring's
and jaxring_jit's records carry the values used.
"""

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

import numpy as np

from byte_sizes import parse_bytes
from ops_in_program import BASE_OPS, chained, ops_per_program, per_op, time_in_steady_state

OUR_IMPLS = ("jaxring", "mpi_bare", "mpi4jax", "jaxring_jit")
DISTRIBUTED_IMPLS = ("jax_gloo", "jaxring_global")  # in a jax.distributed job of their own
ONE_DEVICE_IMPLS = ("mpi4jax", "jaxring_jit")  # they move one device's buffer per process


def sizes(max_bytes):
    size = 4 << 10
    while size <= max_bytes:
        yield size
        size *= 4


# --- inside an mpirun job ----------------------------------------------------


def run_job(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    if set(args.impls) <= set(DISTRIBUTED_IMPLS):
        start_jax_distributed(args.coordinator_host)
    from jaxring.collectives import mpi, topology

    world = topology.init()
    if args.one_shot_max_bytes is not None:
        mpi.ONE_SHOT_MAX_BYTES = args.one_shot_max_bytes
    if args.piece_bytes is not None:
        mpi.PIECE_BYTES = args.piece_bytes
    from jaxring.collectives import _jaxring_mpi

    if args.doubling_max_bytes is not None:
        mpi.DOUBLING_MAX_BYTES = args.doubling_max_bytes
    if args.leg_patience_us is not None:
        _jaxring_mpi.set_leg_patience_us(args.leg_patience_us)
    if args.leg_spin_us is not None:
        _jaxring_mpi.set_leg_spin_us(args.leg_spin_us)
    patience_us = _jaxring_mpi.DEFAULT_LEG_PATIENCE_US if args.leg_patience_us is None else args.leg_patience_us
    spin_us = _jaxring_mpi.DEFAULT_LEG_SPIN_US if args.leg_spin_us is None else args.leg_spin_us
    leg = dict(one_shot_max_bytes=mpi.ONE_SHOT_MAX_BYTES, piece_bytes=mpi.PIECE_BYTES, leg_patience_us=patience_us,
               doubling_max_bytes=mpi.DOUBLING_MAX_BYTES, leg_spin_us=spin_us)
    impls = [i for i in args.impls if not (i in ONE_DEVICE_IMPLS and len(world.local_devices) > 1)]
    if args.cg:
        return write_records(args, world, time_cg(args, world, comm))
    records = []
    for nbytes in args.sizes or sizes(args.max_bytes):
        k = args.ops_per_program or ops_per_program(nbytes)
        steps = {}
        for impl in impls:
            steps.update(make_steps(impl, nbytes // np.dtype(args.dtype).itemsize, k, world, args.dtype))
        rounds = time_steps(steps, comm, args.min_time)
        per_round = {impl: per_op(rounds[impl, k], rounds[impl, BASE_OPS], k) for impl in impls}
        for impl in impls:
            seconds = per_op(np.median(rounds[impl, k]), np.median(rounds[impl, BASE_OPS]), k)
            # round by round: the bare call's time over this impl's under the same load
            paired = float(np.median(per_round["mpi_bare"] / per_round[impl])) if "mpi_bare" in per_round else None
            paired_mpi4jax = (float(np.median(per_round["mpi4jax"] / per_round[impl])) if "mpi4jax" in per_round
                              else None)
            records.append(dict(impl=impl, n_devices=world.n_devices, n_procs=world.size, bytes=nbytes,
                                dtype=args.dtype, ops_per_program=k, median_s=float(seconds), polling=polling(args),
                                paired_speedup_vs_mpi_allreduce=paired, paired_speedup_vs_mpi4jax=paired_mpi4jax,
                                **(leg if impl in ("jaxring", "jaxring_jit") else {})))
            if world.rank == 0:
                print(f"  {impl:14s} {nbytes:>10d} B  {seconds * 1e3:9.3f} ms per op", flush=True)
    write_records(args, world, records)


def write_records(args, world, records):
    if world.rank == 0:
        pathlib.Path(args.job_json).write_text(json.dumps(records))


def polling(args):
    return "busy" if args.busy_poll else "yield"


CG_IMPLS = ("cg_jaxring", "cg_mpi4jax")


def cg_solve(allreduce, b, iterations):
    """`iterations` steps of conjugate gradients on this process' block of (4.5 - the 5-point
    stencil) x = b, the dot products summed across processes by `allreduce(scalar)`: a
    distributed CG's reductions, two scalars per iteration, without its halo exchange."""
    import jax
    import jax.numpy as jnp

    def apply(p):
        return 4.5 * p - sum(jnp.roll(p, shift, axis) for shift in (1, -1) for axis in (0, 1))

    def step(_, state):
        x, r, p, rr = state
        ap = apply(p)
        alpha = rr / jnp.maximum(allreduce(jnp.vdot(p, ap)), 1e-300)
        x, r = x + alpha * p, r - alpha * ap
        rr_new = allreduce(jnp.vdot(r, r))
        p = r + rr_new / jnp.maximum(rr, 1e-300) * p
        return x, r, p, rr_new

    rr = allreduce(jnp.vdot(b, b))
    return jax.lax.fori_loop(0, iterations, step, (jnp.zeros_like(b), b, b, rr))[0]


def time_cg(args, world, comm):
    """The slowest rank's seconds per solve of cg_solve by each of CG_IMPLS, alternated round by round."""
    import jax
    import mpi4jax
    from mpi4py import MPI

    import jaxring.mpi4jax as drop_in

    jax.config.update("jax_enable_x64", True)
    b = np.random.default_rng(world.rank).standard_normal((args.cg_side, args.cg_side))
    libraries = {"cg_jaxring": drop_in, "cg_mpi4jax": mpi4jax}
    solves = {impl: jax.jit(lambda v, library=library: cg_solve(lambda s: library.allreduce(s, MPI.SUM), v,
                                                                  args.cg_iterations))
              for impl, library in libraries.items()}
    results = {impl: np.asarray(solve(b)) for impl, solve in solves.items()}
    # The same solver, the same sums of two (or, over 4, of the same order here): results within rounding.
    difference = np.linalg.norm(results["cg_jaxring"] - results["cg_mpi4jax"])
    assert difference <= 1e-9 * np.linalg.norm(results["cg_mpi4jax"]), difference
    steps = {impl: (lambda s=solve: s(b).block_until_ready()) for impl, solve in solves.items()}
    times = {impl: times for (impl,), times in time_steps({(i,): f for i, f in steps.items()}, comm,
                                                          args.min_time).items()}
    records = []
    for impl in CG_IMPLS:
        paired = float(np.median(times["cg_mpi4jax"] / times[impl]))
        records.append(dict(impl=impl, n_devices=world.n_devices, n_procs=world.size, bytes=8, dtype="float64",
                            cg_iterations=args.cg_iterations, cg_side=args.cg_side, rounds=len(times[impl]),
                            median_s=float(np.median(times[impl])), paired_speedup_vs_mpi4jax=paired,
                            polling=polling(args)))
        if world.rank == 0:
            print(f"  {impl:14s} {np.median(times[impl]) * 1e3:9.3f} ms per solve, mpi4jax/this {paired:.3f}",
                  flush=True)
    return records


def start_jax_distributed(host):
    """jax.distributed (gloo collectives) with its coordinator on rank 0 at `host` (an address every rank can reach)."""
    import jax

    from jaxring.collectives import topology

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    topology.initialize_jax_distributed(host=host)


def make_steps(impl, elements, k, world, dtype):
    """{(impl, ops): function of no arguments running a program of `ops` all-reduces and waiting}, ops in (BASE_OPS, k).

    The programs chain their ops so that they run one after another, as a
    step's buckets at worst do, and hold nothing else. Values grow N-fold per op, at most 8**20 times the
    input's here, far inside float32's range.
    """
    import jax
    import jaxring
    import mpi4jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from mpi4py import MPI

    rows = np.random.default_rng(world.rank).standard_normal((len(world.local_devices), elements)).astype(dtype)

    if impl == "mpi_bare":
        send, receive = rows[0], np.empty_like(rows[0])
        comm = MPI.COMM_WORLD.Clone()

        def bare(ops):
            def run():
                for _ in range(ops):
                    comm.Allreduce(send, receive, op=MPI.SUM)
            return run
        return {(impl, ops): bare(ops) for ops in (BASE_OPS, k)}
    if impl == "jaxring":
        x = jax.device_put(rows, NamedSharding(Mesh(world.local_devices, ("d",)), P("d")))
        reduce = lambda a: jaxring.allreduce(a, "d", processes=True)  # noqa: E731
        programs = {ops: jax.jit(jax.pmap(chained(reduce, ops), "d", devices=world.local_devices)) for ops in (BASE_OPS, k)}
    elif impl in ONE_DEVICE_IMPLS:
        x = jax.device_put(rows[0], world.local_devices[0])
        if impl == "mpi4jax":
            comm = MPI.COMM_WORLD.Clone()
            reduce = lambda a: mpi4jax.allreduce(a, op=MPI.SUM, comm=comm)  # noqa: E731
        else:
            reduce = lambda a: jaxring.allreduce(a, (), processes=True)  # noqa: E731
        programs = {ops: jax.jit(chained(reduce, ops)) for ops in (BASE_OPS, k)}
    else:  # over the global mesh: jax_gloo or jaxring_global
        mesh = Mesh(np.array(jax.devices()), ("d",))
        x = jax.make_array_from_single_device_arrays(
            (len(jax.devices()), elements), NamedSharding(mesh, P("d")),
            [jax.device_put(r[None], d) for r, d in zip(rows, jax.local_devices())],
        )
        reduce = (lambda a: jax.lax.psum(a, "d")) if impl == "jax_gloo" else (lambda a: jaxring.allreduce(a, "d"))
        programs = {
            ops: jax.jit(jax.shard_map(chained(reduce, ops), mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))
            for ops in (BASE_OPS, k)
        }
    return {(impl, ops): (lambda p=program: p(x).block_until_ready()) for ops, program in programs.items()}


def time_steps(steps, comm, min_time):
    """The slowest rank's time of each round, per step (an array over rounds): every step's
    calls timed in their steady state (ops_in_program.time_in_steady_state), the ranks meeting
    at a barrier before each timed call; every rank runs the same number of rounds."""
    from mpi4py import MPI

    first = time_in_steady_state(steps, 1, comm.Barrier)  # compiles too
    first = comm.allreduce(sum(t[0] for t in first.values()), op=MPI.MAX)
    rounds = int(np.clip(min_time / max(first, 1e-9), 5, 200))
    times = time_in_steady_state(steps, rounds, comm.Barrier)
    slowest = np.max(comm.allgather(np.stack([times[key] for key in steps], axis=1)), axis=0)  # [round, step]
    return dict(zip(steps, slowest.T))


# --- the launcher -----------------------------------------------------------


def launch(args):
    records = []
    for n_procs in args.procs:
        groups = [list(CG_IMPLS)] if args.cg else [[i for i in args.impls if i in OUR_IMPLS],
                                                  [i for i in args.impls if i in DISTRIBUTED_IMPLS]]
        for impls in groups:
            if impls:
                print(f"{n_procs} processes x {args.devices_per_proc} devices: {', '.join(impls)}", flush=True)
                records += run_mpirun(args, n_procs, impls)
    add_bandwidths(records)
    print_table(records)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n")


def run_mpirun(args, n_procs, impls):
    with tempfile.TemporaryDirectory() as tmp:
        job_json = pathlib.Path(tmp) / "records.json"
        env = dict(
            os.environ,
            JAX_PLATFORMS="cpu",
            XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices_per_proc}",
        )
        # The machine may be shared: MPI processes waiting for a message yield the
        # core rather than spin through the time slice of the one they wait for.
        command = [str(pathlib.Path(sys.executable).parent / "mpirun"), "--allow-run-as-root", "--oversubscribe"]
        command += [*([] if args.busy_poll else ["--mca", "mpi_yield_when_idle", "1"]), *shlex.split(args.mpirun_args)]
        command += ["-np", str(n_procs)]
        for name in ("JAX_PLATFORMS", "XLA_FLAGS"):
            command += ["-x", name]
        command += [sys.executable, "-m", "mpi4py", __file__, "--job-json", str(job_json)]
        command += ["--impls", *impls, "--max-bytes", str(args.max_bytes), "--min-time", str(args.min_time),
                    "--dtype", args.dtype, *(["--sizes", *map(str, args.sizes)] if args.sizes else []),
                    *(["--busy-poll"] if args.busy_poll else []),
                    *([f"--ops-per-program={args.ops_per_program}"] if args.ops_per_program else []),
                    *(["--cg", "--cg-iterations", str(args.cg_iterations), "--cg-side", str(args.cg_side)]
                      if args.cg else []),
                    "--coordinator-host", args.coordinator_host]
        command += [f"--{name}={getattr(args, name.replace('-', '_'))}"
                    for name in ("one-shot-max-bytes", "piece-bytes", "doubling-max-bytes", "leg-patience-us", "leg-spin-us")
                    if getattr(args, name.replace("-", "_")) is not None]
        subprocess.run(command, env=env, check=True)
        return json.loads(job_json.read_text())


def add_bandwidths(records):
    baseline = {}
    for r in records:
        if r["impl"] == "mpi_bare":
            baseline[r["n_procs"], r["bytes"]] = r["median_s"]
    for r in records:
        if r["impl"] in CG_IMPLS:
            continue
        n = r["n_devices"]
        r["algbw_GBps"] = r["bytes"] / r["median_s"] / 1e9
        r["busbw_GBps"] = r["algbw_GBps"] * 2 * (n - 1) / n
        base = baseline.get((r["n_procs"], r["bytes"]))
        r["speedup_vs_mpi_allreduce"] = base / r["median_s"] if base else None


def print_table(records):
    print(f"\n{'procs':>5} {'devs':>4} {'bytes':>10} {'impl':>14} {'median ms':>10} {'algbw GB/s':>10} "
          f"{'busbw GB/s':>10} {'vs MPI':>7} {'paired':>7} {'mpi4jax/this':>12}")
    for r in [r for r in records if r["impl"] in CG_IMPLS]:
        print(f"{r['n_procs']:>5} procs {r['impl']:>14} {r['median_s'] * 1e3:>10.3f} ms per solve "
              f"({r['cg_iterations']} iterations, {r['polling']} polling), "
              f"mpi4jax/this {r['paired_speedup_vs_mpi4jax']:.3f}")
    sizes_records = [r for r in records if r["impl"] not in CG_IMPLS]
    for r in sorted(sizes_records, key=lambda r: (r["n_procs"], r["bytes"], r["impl"])):
        ratio = f"{r['speedup_vs_mpi_allreduce']:.2f}x" if r["speedup_vs_mpi_allreduce"] else "-"
        paired = f"{r['paired_speedup_vs_mpi_allreduce']:.2f}x" if r.get("paired_speedup_vs_mpi_allreduce") else "-"
        print(f"{r['n_procs']:>5} {r['n_devices']:>4} {r['bytes']:>10} {r['impl']:>14} {r['median_s'] * 1e3:>10.3f} "
              f"{r['algbw_GBps']:>10.3f} {r['busbw_GBps']:>10.3f} {ratio:>7} {paired:>7} "
              f"{format(r['paired_speedup_vs_mpi4jax'], '.2f') + 'x' if r.get('paired_speedup_vs_mpi4jax') else '-':>12}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4], help="process counts, one mpirun job each")
    parser.add_argument("--devices-per-proc", type=int, default=1)
    parser.add_argument("--impls", nargs="+", default=[*OUR_IMPLS, *DISTRIBUTED_IMPLS],
                        choices=[*OUR_IMPLS, *DISTRIBUTED_IMPLS, *CG_IMPLS])
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 << 20, help="largest buffer per device, e.g. 64M")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="the buffers' element type")
    parser.add_argument("--sizes", type=parse_bytes, nargs="+", help="these sizes per device (e.g. 8 64 4K 64K) "
                        "instead of 4 KiB .. --max-bytes")
    parser.add_argument("--ops-per-program", type=int, help="K, the all-reduces in the timed program (default: "
                        "ops_in_program.ops_per_program's, at most 21); more for small sizes on a loaded machine")
    parser.add_argument("--busy-poll", action="store_true", help="Open MPI's default busy polling, not yielding")
    parser.add_argument("--cg", action="store_true", help="time the CG-shaped loop (cg_jaxring, cg_mpi4jax) instead")
    parser.add_argument("--cg-iterations", type=int, default=200)
    parser.add_argument("--cg-side", type=int, default=64, help="the block per process: side x side float64")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds of timed iterations per point (at least 5)")
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--mpirun-args", default="", help="more options for mpirun, e.g. '--mca btl tcp,self'")
    parser.add_argument("--one-shot-max-bytes", type=parse_bytes,
                        help="jaxring's leg: largest buffer sent one-shot where not by recursive doubling "
                        "(default: mpi.ONE_SHOT_MAX_BYTES)")
    parser.add_argument("--piece-bytes", type=parse_bytes, help="jaxring's leg: ring piece size (default: mpi.PIECE_BYTES)")
    parser.add_argument("--doubling-max-bytes", type=parse_bytes,
                        help="jaxring's leg: largest buffer by recursive doubling over 4, 8, ... processes "
                        "(default: mpi.DOUBLING_MAX_BYTES; 0: one-shot or the ring, by --one-shot-max-bytes)")
    parser.add_argument("--leg-spin-us", type=int,
                        help="jaxring's leg: how long each wait polls MPI before yielding the core (default: csrc/mpi/mpi_ring.h's)")
    parser.add_argument("--leg-patience-us", type=int,
                        help="jaxring's leg: how long it may wait at a time on XLA's thread (default: csrc/mpi/mpi_ring.h's)")
    parser.add_argument("--coordinator-host", default="127.0.0.1",
                        help="jax_gloo: rank 0's address that every rank reaches (on an emulated network, node 0's)")
    parser.add_argument("--job-json", help=argparse.SUPPRESS)  # set by the launcher for its mpirun jobs
    return parser.parse_args(argv)


def main():
    args = parse_args()
    if args.job_json:
        run_job(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
