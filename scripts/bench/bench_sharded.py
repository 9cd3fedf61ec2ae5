"""train.shard_optimizer against the replicated step, in one run: the weights after queued steps, the optimizer
state's bytes per device, and step time alternated.

    python scripts/bench/bench_sharded.py weights --host-devices 4 --steps 300 --json docs/bench/sharded_weights.json
    mpirun -np 2 python scripts/bench/bench_sharded.py weights --host-devices 2 --steps 300 --json ...
    python scripts/bench/bench_sharded.py weights --config configs/ds2_tiny.yaml --set data.utterances=1000 ...
    python scripts/bench/bench_sharded.py time --host-devices 8 --model charlm_4m --json docs/bench/sharded_time.json

`weights`: the experiment (examples/charlm/charlm.yaml unless --config) trained --steps queued steps
from the same seed, replicated and sharded, on the same batches; records the largest absolute and
relative difference of the weights and optimizer state (gathered to the replicated layout), whether
they are bit for bit equal, whether every device holds the same bits, and the final losses.
`time`: both steps on the same fixed batch, --pairs pairs of --loop-steps queued steps alternated
(replicated first, then sharded), each pair's ratio sharded / replicated; and the optimizer state's
bytes per device (its arrays on device 0; JAX's memory statistics where the backend gives them).
Each run appends one record to --json (a list), keyed by what it measured, and prints it as a table.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_train import FixedBatches  # noqa: E402  (scripts/bench/bench_train.py: one batch, every step)
from jaxring.engine.launch import expose_host_devices  # noqa: E402

CHARLM = ROOT / "examples" / "charlm" / "charlm.yaml"
# --model: overrides of examples/charlm's model section. charlm_4m: 4.8 M parameters in 6 layers of width 256.
MODELS = {"charlm": [], "charlm_4m": ["model.width=256", "model.layers=6", "model.heads=8"]}


def trainers(args, world, batches=None):
    """{False: the replicated Trainer, True: the sharded one} of the same experiment."""
    import models  # noqa: F401  (registers deepspeech2: --config configs/ds2_tiny.yaml)
    from jaxring.engine.experiment import build_task, load_config
    from jaxring.engine.trainer import Trainer

    built = {}
    for shard in (False, True):
        overrides = [*MODELS[args.model], f"train.shard_optimizer={str(shard).lower()}", *args.set]
        config = load_config(args.config, overrides, ROOT)
        workdir = ROOT / "runs" / "bench_sharded"
        built[shard] = Trainer(build_task(config), config, workdir, world, batches=batches)
    return built


def queued(trainer, state, batches, steps: int):
    """`steps` steps of `batches`, queued as the Trainer queues them; (state, the last loss)."""
    import collections

    from jaxring.engine.devices import split_sources
    from jaxring.engine.trainer import STEPS_IN_FLIGHT

    in_flight = collections.deque()
    for _, batch in zip(range(steps), batches):
        state, out = trainer.train_step(state, split_sources(batch)[0])
        in_flight.append(out["loss"])
        if len(in_flight) > STEPS_IN_FLIGHT:
            in_flight.popleft().block_until_ready()
    return state, float(in_flight[-1][0])


def weights(args, world) -> dict:
    import jax
    import numpy as np

    built = trainers(args, world)
    finals, losses, same_on_devices = {}, {}, {}
    for shard, trainer in built.items():
        state = trainer.on_devices(trainer.init_state())
        state, losses[shard] = queued(trainer, state, iter(trainer.batches), args.steps)
        same_on_devices[shard] = all(bool((np.asarray(x) == np.asarray(x)[:1]).all())
                                     for x in jax.tree_util.tree_leaves(state.params))
        finals[shard] = trainer.on_host(state)
    baseline = _replicated_elsewhere(args, finals[False].params, world)
    a, b = (jax.tree_util.tree_leaves(finals[shard]) for shard in (False, True))
    pairs = [(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in zip(a, b)]
    params_a, params_b = (jax.tree_util.tree_leaves(finals[shard].params) for shard in (False, True))
    scale = max(float(np.max(np.abs(x))) for x in params_a)
    return {
        "steps": args.steps,
        "loss_replicated": losses[False],
        "loss_sharded": losses[True],
        "params_bit_equal": all(np.array_equal(x, y) for x, y in zip(params_a, params_b)),
        "params_max_abs_difference": max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                                         for x, y in zip(params_a, params_b)),
        "params_max_abs": scale,
        "state_max_abs_difference": max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in pairs),
        "sharded_same_bits_on_every_device": same_on_devices[True],
        **baseline,
    }


def _replicated_elsewhere(args, params, world) -> dict:
    """The noise floor: how far this run's replicated weights are from those of the first shape (processes x
    devices) this script trained the same experiment on, whose summation order differs. Kept in runs/."""
    import jax
    import numpy as np

    if world is not None and world.rank != 0:
        return {}
    name = "_".join([args.config.stem, args.model, str(args.steps), *args.set]).replace("/", "_")
    saved = ROOT / "runs" / "bench_sharded" / f"replicated_{name}.npz"
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]
    if not saved.exists():
        saved.parent.mkdir(parents=True, exist_ok=True)
        np.savez(saved, *leaves, shape=np.asarray([1 if world is None else world.size, jax.local_device_count()]))
        return {}
    with np.load(saved) as first:
        other = [first[f"arr_{i}"] for i in range(len(leaves))]
        shape = "x".join(map(str, first["shape"]))
    return {f"replicated_vs_replicated_on_{shape}_max_abs_difference":
            max(float(np.max(np.abs(x - y))) for x, y in zip(leaves, other))}


def opt_state_bytes(state) -> int:
    """Bytes of device 0's optimizer state (pmap's leading axis is the devices)."""
    import jax

    return sum(leaf[0].nbytes for leaf in jax.tree_util.tree_leaves(state.opt_state))


def memory_stats(devices) -> dict | None:
    stats = devices[0].memory_stats()
    return None if stats is None else {k: stats[k] for k in ("bytes_in_use", "peak_bytes_in_use") if k in stats}


def timed(args, world) -> dict:
    import jax

    from jaxring.engine.devices import split_sources

    probe = trainers(args, world)[False]
    batch = split_sources(next(iter(probe.batches)))[0]
    built = trainers(args, world, FixedBatches(batch))
    states, record = {}, {}
    for shard, trainer in built.items():
        states[shard] = trainer.on_devices(trainer.init_state())
        states[shard], _ = queued(trainer, states[shard], iter(trainer.batches), 3)  # compiles
        jax.block_until_ready(states[shard])
        name = "sharded" if shard else "replicated"
        record[f"opt_state_bytes_per_device_{name}"] = opt_state_bytes(states[shard])
        record[f"memory_stats_{name}"] = memory_stats(trainer.devices)
    params = sum(x[0].size for x in jax.tree_util.tree_leaves(states[False].params))
    seconds = {False: [], True: []}
    for _ in range(args.pairs):
        for shard, trainer in built.items():
            start = time.perf_counter()
            states[shard], _ = queued(trainer, states[shard], iter(trainer.batches), args.loop_steps)
            jax.block_until_ready(states[shard])
            seconds[shard].append((time.perf_counter() - start) / args.loop_steps)
    ratios = [s / r for r, s in zip(seconds[False], seconds[True])]
    return {"parameters": int(params), "pairs": args.pairs, "loop_steps": args.loop_steps,
            "step_s_replicated": statistics.median(seconds[False]), "step_s_sharded": statistics.median(seconds[True]),
            "ratio_sharded_over_replicated_median": statistics.median(ratios),
            "ratios": ratios, **record}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["weights", "time"])
    parser.add_argument("--host-devices", type=int, default=1, help="XLA host devices of each process")
    parser.add_argument("--config", type=Path, default=CHARLM)
    parser.add_argument("--model", choices=list(MODELS), default="charlm")
    parser.add_argument("--set", action="append", default=[], help="more config overrides, section.key=value")
    parser.add_argument("--steps", type=int, default=300, help="weights: queued steps of each run")
    parser.add_argument("--pairs", type=int, default=5, help="time: alternated pairs")
    parser.add_argument("--loop-steps", type=int, default=20, help="time: queued steps per timed loop")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.config = args.config.resolve()
    expose_host_devices(args.host_devices)
    world = None
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        import jaxring

        world = jaxring.init()
    import jax

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    measured = weights(args, world) if args.what == "weights" else timed(args, world)
    model = args.config.stem if args.model == "charlm" else args.model  # charlm's overrides are none: the config's
    record = {"what": args.what, "config": str(args.config.relative_to(ROOT)), "model": model,
              "overrides": args.set, "processes": 1 if world is None else world.size,
              "local_devices": jax.local_device_count(), "started": started, **measured}
    if world is not None and world.rank != 0:
        return record
    print("\n".join(f"{k:40s} {v}" for k, v in record.items()), flush=True)
    if args.json:
        records = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*records, record], indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
