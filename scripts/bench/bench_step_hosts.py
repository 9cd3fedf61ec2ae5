"""A training step across emulated hosts, the gradients averaged several ways in the same run: the engine's two paths, lax, mpi4jax.

    sudo .venv/bin/python scripts/bench/bench_step_hosts.py --nodes 2 4 --rates 1gbit 10gbit \\
        --configs configs/ds2_tiny.yaml examples/charlm/charlm.yaml --json docs/bench/step-hosts-cpu2-DATE.json

For each rate and node count, on a fresh emulated cluster (scripts/bench/cluster/cluster.py: one process and
--devices-per-node host devices per node), one mpirun job per config builds the config's task, optimizer
and state (the engine's Trainer, the global batch --batch-per-node x nodes) and its first training batch,
then times the same step with --ways of averaging what the step averages (gradients, model state, loss):

  jaxring   the engine's own step (jaxring/engine/sync.py: fused buckets, jaxring.allreduce(processes=True))
  sharded   the engine's step under train.shard_optimizer (jaxring/engine/sharded_step.py: the gradients
            reduce-scattered, each device's block of the optimizer state updated, the weights all-gathered)
  engine_mpi4jax  the engine's step under train.across_processes mpi4jax (jaxring/engine/sync_mpi4jax.py)
  lax_gloo  what JAX offers without jaxring: jax.distributed (gloo collectives) and lax.pmean of each
            leaf over a mesh of every process' device, in a jitted shard_map
  mpi4jax   mpi4jax.allreduce of each leaf, over the process count, in the jitted step
  none      no averaging (each process steps on its own gradients): the step's compute alone

Every way runs in the one job (jax.distributed is started for lax_gloo, idle for the others). The
per-process part of the step is the engine's (jaxring/engine/step.py, StepParts) in each; the engine's
paths map it over its devices with pmap, the others with vmap over one device's batch (so with several
devices per node, time only the engine's: --ways jaxring engine_mpi4jax). Timing: rounds in
a random order (scripts/bench/ops_in_program.py: each timed call right after an untimed one), each call
--steps steps queued then waited for; the slowest process' time per round, median over rounds.
all-reduce share = (step - none's step) / step. Before timing, one step from the same state by each
way: the losses, gradient norms and new weights must agree (the job fails otherwise). Then, per way,
the bytes each node's link sent (its eth0 in /proc/net/dev) over --steps more steps: the wire's
bytes per step, with everything else the job sends (TCP/IP headers, barriers, scalar reductions).
Each engine way's optimizer state per device (its arrays) is recorded, with JAX's memory statistics
of device 0 where the backend gives them (every way's state lives on the same devices at once).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "bench" / "cluster"))

WAYS = ("jaxring", "sharded", "engine_mpi4jax", "lax_gloo", "mpi4jax", "none")
SYNCED = WAYS[:5]
# One step by each way from the same state: the averages differ only in the order of their float32
# additions (none with 2 processes: a sum of two is the same either way), so every float leaf of
# the new state (weights, optimizer moments: the averaged gradients themselves, model state) and
# the outputs agree to a few ulp of the leaf's largest magnitude. sharded's state is compared
# gathered to the replicated layout (Trainer.on_host).
STATE_RTOL = 1e-5


# --- one job: every process of an mpirun ---------------------------------------


def run_job(args) -> None:
    from mpi4py import MPI

    from bench_allreduce_mpi import start_jax_distributed

    comm = MPI.COMM_WORLD
    start_jax_distributed(args.coordinator_host)
    import jax
    import numpy as np

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.collectives import topology
    from jaxring.engine.devices import split_sources
    from jaxring.engine.experiment import build_task, load_config
    from jaxring.engine.trainer import Trainer
    from bench_sharded import memory_stats, opt_state_bytes
    from ops_in_program import time_in_steady_state

    world = topology.init()
    workdirs = tempfile.TemporaryDirectory()  # the Trainers' run directories, for the whole job

    def trainer_with(*more):
        overrides = [f"train.batch_size={args.batch_per_node * world.size}", *args.set, *more]
        path = ROOT / args.config if not Path(args.config).is_absolute() else args.config
        config = load_config(path, overrides, ROOT)
        return Trainer(build_task(config), config, tempfile.mkdtemp(dir=workdirs.name), world)

    trainer = trainer_with()
    sharded = trainer_with("train.shard_optimizer=true") if "sharded" in args.ways else None
    batch, _ = split_sources(next(iter(trainer.batches)))
    host_state = trainer.init_state()  # rank 0's, broadcast
    ways = args.ways
    steps = {way: make_step(way, trainer, host_state, batch, world, sharded) for way in ways}

    firsts = {way: step.first() for way, step in steps.items()}
    check = agreement(firsts)
    failed = comm.allgather(check["failed"])
    if any(failed):
        raise SystemExit(f"rank {world.rank}: the ways disagree after one step: {failed}")

    state_bytes = {way: opt_state_bytes(step.state) for way, step in steps.items() if step.per_device}
    # the busiest link's bytes sent per step (None: no eth0, not on an emulated cluster)
    wire_bytes = {way: busiest(comm.allgather(sent_per_step(step, args.steps, comm))) for way, step in steps.items()}
    calls = {way: (lambda s=step: s.run(args.steps)) for way, step in steps.items()}
    time_in_steady_state(calls, 1, comm.Barrier)  # compiles the runs of --steps and settles
    times = time_in_steady_state(calls, args.rounds, comm.Barrier)
    slowest = np.max(comm.allgather(np.stack([times[way] for way in ways], axis=1)), axis=0) / args.steps
    if world.rank != 0:
        return
    per_way = {way: float(np.median(slowest[:, i])) for i, way in enumerate(ways)}
    grads = host_state.params
    record = dict(
        config=str(args.config), processes=world.size, local_devices=len(world.local_devices),
        global_batch=trainer.config.train.batch_size, steps_per_call=args.steps, rounds=args.rounds,
        parameters=int(sum(np.size(x) for x in jax.tree_util.tree_leaves(grads))),
        gradient_bytes=int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(grads))),
        leaves=len(jax.tree_util.tree_leaves(grads)), bucket_bytes=trainer.bucket_bytes,
        step_s=per_way, step_s_per_round={way: slowest[:, i].tolist() for i, way in enumerate(ways)},
        # per round, each way over jaxring's in the same round (the calls alternate): the noise of a shared machine
        over_jaxring_per_round={way: (slowest[:, i] / slowest[:, 0]).tolist() for i, way in enumerate(ways)},
        allreduce_share={way: (per_way[way] - per_way["none"]) / per_way[way]
                         for way in ways if way in SYNCED and "none" in ways},
        opt_state_bytes_per_device=state_bytes, memory_stats=memory_stats(trainer.devices),
        wire_bytes_per_step=wire_bytes,
        check=check,
    )
    Path(args.job_json).write_text(json.dumps(record))


class Step:
    """One way's step: `first()` one step from the initial state (its outputs and new state, on the
    host); `run(n)` n more steps queued, then waits."""

    def __init__(self, program, state, batch, per_device: bool = False, on_host=None):
        """`per_device`: the state and outputs carry a leading axis of local devices (pmap's).
        `on_host`: the state's host form, where it is not device 0's (train.shard_optimizer's blocks)."""
        self.program, self.state, self.batch, self.per_device = program, state, batch, per_device
        self.on_host = on_host

    def first(self):
        import jax
        import numpy as np

        self.state, out = self.program(self.state, self.batch)
        host = lambda x: np.asarray(x)[0] if self.per_device else np.asarray(x)  # noqa: E731
        state = self.on_host(self.state) if self.on_host else jax.tree_util.tree_map(host, self.state)
        return jax.tree_util.tree_map(host, out), state

    def run(self, n: int) -> None:
        import jax

        for _ in range(n):
            self.state, out = self.program(self.state, self.batch)
        jax.block_until_ready(out)


def sent_per_step(step: Step, n: int, comm) -> float | None:
    """Bytes this process' node sent over its link per step, over `n` steps of `step` (None without eth0)."""
    comm.Barrier()
    before = eth0_sent_bytes()
    step.run(n)
    comm.Barrier()
    after = eth0_sent_bytes()
    return None if before is None else (after - before) / n


def busiest(sent: list) -> float | None:
    return None if None in sent else max(sent)


def eth0_sent_bytes() -> int | None:
    """Bytes sent by this network namespace's eth0 (an emulated node's link), or None if it has none."""
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, counters = line.split(":", 1)
        if name.strip() == "eth0":
            return int(counters.split()[8])  # receive has 8 columns, then transmit's bytes
    return None


def make_step(way, trainer, host_state, batch, world, sharded=None) -> Step:
    """`sharded`: the Trainer of the same config under train.shard_optimizer (way "sharded")."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from jaxring.engine.task import AXIS

    if way == "jaxring":
        return Step(trainer.train_step, trainer.on_devices(host_state), batch, per_device=True)
    if way == "sharded":
        return Step(sharded.train_step, sharded.on_devices(host_state), batch, per_device=True,
                    on_host=sharded.on_host)
    if way == "engine_mpi4jax":
        from jaxring.engine.devices import split_for_devices
        from jaxring.engine.step import make_train_step
        from jaxring.engine.sync_mpi4jax import Mpi4jaxSync

        train = trainer.config.train
        sync = Mpi4jaxSync(world.size, train.allreduce, trainer.bucket_bytes, train.allreduce_dtype)
        step = make_train_step(trainer.step_parts, sync, trainer.devices)
        return Step(lambda state, b: step(state, split_for_devices(b, len(trainer.devices))),
                    trainer.on_devices(host_state), batch, per_device=True)
    device = world.local_devices[0]
    one_batch = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], batch)

    def averaged_by(average):
        """The engine's per-process step on one device's batch, `average` applied to what it averages."""
        def step(state, one):
            local = jax.vmap(trainer.step_parts.local, in_axes=(None, 0), axis_name=AXIS)(state, one)
            return trainer.step_parts.finish(state, average(jax.tree_util.tree_map(lambda x: x[0], local)))
        return step

    if way == "lax_gloo":
        mesh = Mesh(np.array(jax.devices()), ("hosts",))

        def global_array(x, spec, shape):
            return jax.make_array_from_single_device_arrays(shape, NamedSharding(mesh, spec),
                                                            [jax.device_put(np.asarray(x), device)])

        state = jax.tree_util.tree_map(lambda x: global_array(x, P(), np.shape(x)), host_state)
        one_batch = jax.tree_util.tree_map(
            lambda x: global_array(x, P("hosts"), (world.size,) + x.shape[1:]), one_batch)
        mean = lambda tree: jax.tree_util.tree_map(lambda x: jax.lax.pmean(x, "hosts"), tree)  # noqa: E731
        program = jax.jit(jax.shard_map(averaged_by(mean), mesh=mesh, in_specs=(P(), P("hosts")),
                                        out_specs=(P(), P()), check_vma=False), donate_argnums=0)
        return Step(program, state, one_batch)
    if way == "mpi4jax":
        import mpi4jax
        from mpi4py import MPI

        comm = MPI.COMM_WORLD.Clone()

        def mean(tree):
            return jax.tree_util.tree_map(
                lambda x: (mpi4jax.allreduce(x, op=MPI.SUM, comm=comm) / world.size).astype(x.dtype), tree)
    else:
        mean = lambda tree: tree  # noqa: E731
    return Step(jax.jit(averaged_by(mean), donate_argnums=0), jax.device_put(host_state, device),
                jax.device_put(one_batch, device))


def agreement(firsts: dict) -> dict:
    """How far the synced ways' first steps are from the engine's: the largest difference in any float
    leaf of (outputs, new state) over that leaf's largest magnitude; `failed` names what is beyond STATE_RTOL."""
    import jax
    import numpy as np

    def relative(a, b):
        if not np.issubdtype(np.asarray(b).dtype, np.floating):
            return 0.0 if np.array_equal(a, b) else np.inf
        return float(np.max(np.abs(a - b), initial=0.0) / max(float(np.max(np.abs(b), initial=0.0)), 1e-30))

    result = {"failed": []}
    for way in [way for way in SYNCED[1:] if way in firsts]:
        worst = max(jax.tree_util.tree_leaves(jax.tree_util.tree_map(relative, firsts[way], firsts["jaxring"])))
        result[way] = worst
        if not worst <= STATE_RTOL:
            result["failed"].append(f"{way}: a leaf {worst:.2e} of its magnitude from jaxring's")
    return result


# --- the launcher ------------------------------------------------------------------


def job_command(config: str, out: Path, coordinator: str, args) -> list[str]:
    return [sys.executable, "-m", "mpi4py", str(Path(__file__).resolve()), "--job", "--config", config,
            "--job-json", str(out), "--coordinator-host", coordinator, "--batch-per-node", str(args.batch_per_node),
            "--steps", str(args.steps), "--rounds", str(args.rounds), "--ways", *args.ways,
            *(f"--set={o}" for o in args.set)]


def print_record(r: dict, ways) -> None:
    t = r["step_s"]
    print(f"{Path(r['config']).stem:<12} {r['processes']:>5}x{r['local_devices']:<2} {r['rate']:>7} "
          + " ".join(f"{1e3 * t[w]:>9.1f}" for w in ways)
          + "".join(f" {t[w] / t['jaxring']:>8.2f}x" for w in ways[1:])
          + "".join(f" {100 * r['allreduce_share'][w]:>5.0f}%" for w in r["allreduce_share"]), flush=True)
    wire = r["wire_bytes_per_step"]
    print(" " * 30 + "sent per step, KB: " + " ".join(f"{w} {wire[w] / 1e3:.1f}" for w in ways if wire[w] is not None)
          + "; optimizer state per device, MB: "
          + " ".join(f"{w} {b / 1e6:.2f}" for w, b in r["opt_state_bytes_per_device"].items()), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", action="store_true", help="(internal) run as one process of the mpirun job")
    parser.add_argument("--job-json", type=Path, help="(internal) where rank 0 writes the job's record")
    parser.add_argument("--coordinator-host", default=None, help="(internal) jax.distributed's coordinator address")
    parser.add_argument("--config", help="(internal) the job's config")
    parser.add_argument("--configs", nargs="+", default=["configs/ds2_tiny.yaml"],
                        help="experiment configs (a task in examples/ is found: examples/ is on PYTHONPATH)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"], help="link rates (tc syntax)")
    parser.add_argument("--batch-per-node", type=int, default=8)
    parser.add_argument("--devices-per-node", type=int, default=1, help="host devices of each node's process")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS),
                        help="the ways to time (jaxring first: the others' ratios are over it)")
    parser.add_argument("--steps", type=int, default=5, help="steps queued per timed call")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls of each way (median)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a config override for every config, e.g. train.allreduce_dtype=bfloat16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.ways[0] != "jaxring":
        parser.error("--ways: jaxring comes first (the others are timed against it)")
    if args.job:
        return run_job(args)

    from cluster import Cluster, interrupt_on_termination, parse_rate

    interrupt_on_termination()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices_per_node}",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    result = {"machine": f"{os.cpu_count()}-core {platform.machine()} CPU, every emulated host on it; emulated links",
              "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
              "command": " ".join(["python", *sys.argv]), "ways": args.ways, "records": []}
    print(f"{'config':<12} {'shape':>8} {'rate':>7} " + " ".join(f"{w[:9] + ' ms':>9}" for w in args.ways)
          + "".join(f" {w[:7] + '/jr':>9}" for w in args.ways[1:]) + " shares")
    for rate in args.rates:
        for n in args.nodes:
            with Cluster(n, rate) as cluster, tempfile.TemporaryDirectory() as tmp:
                for config in args.configs:
                    out = Path(tmp) / "record.json"
                    command = cluster.mpirun(job_command(config, out, cluster.addresses[0], args),
                                             env_names=["PYTHONPATH"], env=env)
                    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
                    record = json.loads(out.read_text())
                    record.update(rate=rate, rate_bps=parse_rate(rate))
                    result["records"].append(record)
                    print_record(record, args.ways)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
