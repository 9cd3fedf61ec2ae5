"""Training-step throughput of Deep Speech 2 configs, ring vs psum all-reduce in the same run.

    python scripts/bench/bench_train.py --configs ds2_tiny ds2_small --json runs/bench_train.json

Times the full pmapped step (forward, backward, all-reduce, update) on
fixed-shape random batches, so the data pipeline and compilation are left
out; the all-reduce alone is timed on a gradient-shaped tree to give its
share of the step. With --loop-steps N, loops of N steps are also timed
three ways, alternated and repeated (median): blocking after every step,
blocking every 10 steps (the trainer before steps were queued: its default
log_every), and keeping the trainer's STEPS_IN_FLIGHT steps queued. On a GPU, MFU = achieved FLOP/s over the peak given with
--peak-tflops, from model_summary's analytic FLOPs per audio second.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jaxring.engine.launch import expose_host_devices  # noqa: E402


class FixedBatches:
    """The same random batch every step: steps_per_epoch is irrelevant here."""

    steps_per_epoch = 1 << 30

    def __init__(self, batch):
        self.batch = batch

    def __iter__(self):
        while True:
            yield self.batch

    def state(self):
        return {}

    def restore(self, state):
        pass


def random_batch(batch_size: int, seconds: float, labels_per_second: int = 12, seed: int = 0) -> dict:
    import numpy as np

    from models.deepspeech2.data import features

    rng = np.random.default_rng(seed)
    frames = int(seconds * 100)
    label_length = max(1, int(seconds * labels_per_second))
    return {
        "features": rng.normal(size=(batch_size, frames, features.NUM_BINS)).astype(np.float32),
        "feature_lengths": np.full(batch_size, frames, np.int32),
        "labels": rng.integers(1, 29, size=(batch_size, label_length)).astype(np.int32),
        "label_lengths": np.full(batch_size, label_length, np.int32),
        "weights": np.ones(batch_size, np.float32),
    }


# Loops timed for --loop-steps (loop_seconds_per_step says how each waits), medians of LOOP_REPEATS.
LOOP_KINDS = ("blocked", "every_10", "queued")
LOOP_REPEATS = 3


def loop_seconds_per_step(step, steps: int) -> dict:
    """Seconds per step of `steps`-step loops (median of LOOP_REPEATS, the three kinds alternated):
    "blocked" waits for each step, "every_10" for every 10th and all before it, "queued" keeps the
    trainer's STEPS_IN_FLIGHT steps queued."""
    import collections
    import statistics

    import jax

    from jaxring.engine.trainer import STEPS_IN_FLIGHT

    def run(kept: int, every: int) -> float:
        in_flight = collections.deque()
        start = time.perf_counter()
        for k in range(1, steps + 1):
            in_flight.append(step()["loss"])
            if every and k % every == 0:
                jax.block_until_ready(list(in_flight))
                in_flight.clear()
            while len(in_flight) > kept:
                in_flight.popleft().block_until_ready()
        jax.block_until_ready(list(in_flight))
        return (time.perf_counter() - start) / steps

    kinds = dict(zip(LOOP_KINDS, [(0, 0), (steps, 10), (STEPS_IN_FLIGHT, 0)]))
    times = collections.defaultdict(list)
    for _ in range(LOOP_REPEATS):
        for name, (kept, every) in kinds.items():
            times[name].append(run(kept, every))
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def bench(name: str, allreduce: str, args, world) -> dict:
    import jax

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.engine.experiment import build_task, load_config
    from jaxring.engine.timing import median_seconds
    from jaxring.engine.trainer import Trainer
    from models.deepspeech2 import summary as model_summary

    overrides = [f"train.batch_size={args.batch_size}", f"train.allreduce={allreduce}", *args.overrides]
    config = load_config(ROOT / "configs" / f"{name}.yaml", overrides, ROOT)
    batch = random_batch(args.batch_size // world.size, args.seconds)
    trainer = Trainer(build_task(config), config, ROOT / "runs" / "bench_train", world, batches=FixedBatches(batch))
    state = trainer.on_devices(trainer.init_state())
    start = time.perf_counter()
    state, out = trainer.train_step(state, batch)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - start

    def step():
        nonlocal state
        state, out = trainer.train_step(state, batch)
        return out

    step_s = median_seconds(step, args.steps, warmup=0)  # compiled above
    loops = loop_seconds_per_step(step, args.loop_steps) if args.loop_steps else {}
    allreduce_s = trainer.time_sync(state)
    audio_seconds = args.batch_size * args.seconds
    flops = model_summary.flops_per_audio_second(config.model, training=True) * audio_seconds
    record = {
        "config": name,
        "allreduce": allreduce,
        "platform": trainer.devices[0].platform,
        "local_devices": trainer.n_local,
        "processes": world.size,
        "global_batch": args.batch_size,
        "audio_seconds_per_utterance": args.seconds,
        "parameters": model_summary.count_params(config.model),
        "compile_s": compile_s,
        "step_s": step_s,
        "steps_per_s": 1 / step_s,
        "utt_per_s": args.batch_size / step_s,
        "allreduce_s": allreduce_s,
        "allreduce_share": allreduce_s / step_s,
        "tflops_per_s": flops / step_s / 1e12,
        **{f"loop_step_s_{name}": seconds for name, seconds in loops.items()},
    }
    if args.peak_tflops:
        record["mfu"] = record["tflops_per_s"] / (args.peak_tflops * trainer.n_local * world.size)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ds2_tiny", "ds2_small"])
    parser.add_argument("--allreduce", nargs="+", default=["ring", "psum"], choices=["ring", "psum"])
    parser.add_argument("--batch-size", type=int, default=32, help="global batch")
    parser.add_argument("--seconds", type=float, default=2.0, help="audio per utterance")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    parser.add_argument("--loop-steps", type=int, default=0,
                        help="also time loops of this many steps: blocked each step, every 10, queued")
    parser.add_argument("--host-devices", type=int, default=os.cpu_count())
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak dense TFLOP/s of one device (e.g. 989 for H100 bf16) to report MFU")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config override for every benchmarked config; repeatable")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    expose_host_devices(args.host_devices)

    import jaxring

    world = jaxring.init()
    records = [bench(name, allreduce, args, world) for name in args.configs for allreduce in args.allreduce]
    if world.rank != 0:
        return
    header = f"{'config':<10} {'allreduce':<9} {'dev':>4} {'proc':>4} {'params':>10} {'step ms':>9} {'steps/s':>8} " \
             f"{'utt/s':>7} {'AR ms':>7} {'AR share':>8} {'TFLOP/s':>8}" + (f" {'MFU':>6}" if args.peak_tflops else "")
    print(header)
    for r in records:
        line = (f"{r['config']:<10} {r['allreduce']:<9} {r['local_devices']:>4} {r['processes']:>4} "
                f"{r['parameters']:>10,} {1e3 * r['step_s']:>9.1f} {r['steps_per_s']:>8.2f} {r['utt_per_s']:>7.1f} "
                f"{1e3 * r['allreduce_s']:>7.2f} {100 * r['allreduce_share']:>7.1f}% {r['tflops_per_s']:>8.4f}")
        print(line + (f" {100 * r['mfu']:>5.1f}%" if args.peak_tflops else ""))
    if args.loop_steps:
        print(f"\nloops of {args.loop_steps} steps, ms per step (median of {LOOP_REPEATS}, alternated); "
              "ratio: blocked each step / queued")
        print(f"{'config':<10} {'allreduce':<9} " + " ".join(f"{name:>9}" for name in LOOP_KINDS) + f" {'ratio':>6}")
        for r in records:
            loop = [r[f"loop_step_s_{name}"] for name in LOOP_KINDS]
            print(f"{r['config']:<10} {r['allreduce']:<9} " + " ".join(f"{1e3 * s:>9.1f}" for s in loop)
                  + f" {r['loop_step_s_blocked'] / r['loop_step_s_queued']:>6.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d", time.gmtime()), "records": records}, indent=2))


if __name__ == "__main__":
    main()
