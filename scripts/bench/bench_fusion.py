"""Does tensor fusion pay? The engine's gradient sync three ways, alternated in the same run.

    python scripts/bench/bench_fusion.py --devices 2 4 8 --rounds 9 --json runs/fusion.json
    python scripts/bench/bench_fusion.py --quick --json /tmp/fusion.json   # 2 devices, one tree, few rounds

Each way averages a gradient tree over the devices inside a pmapped step
shaped as the engine's (make_train_step, jaxring/engine/step.py): the step
computes its gradients from the state it was given (so they change every
call and differ per device), averages them, updates the donated state, and
the loop keeps the trainer's STEPS_IN_FLIGHT steps queued, as training does.
The ways:
- "fused:<bytes>": Sync.mean, the leaves packed into buckets of at most
  <bytes> (jaxring/collectives/fusion.py), one jaxring all-reduce each; the
  platform's default bucket size and the --bucket-bytes sizes;
- "per_leaf_ring": jaxring.allreduce of the tree, one all-reduce per leaf;
- "pmean": lax.pmean of the tree, what a user without jaxring writes (XLA
  may combine the leaves' all-reduces itself);
and "no_sync", the same step with no mean, whose time is subtracted from
each way's: sync_s is what the mean adds to a step.

Each round times one queued loop of every way, in a new random order
(scripts/bench/ops_in_program.py's time_in_steady_state: each timed loop right
after an untimed one of the same way); a subprocess per device count, since
JAX fixes its host devices when it starts. `ratio` is this way's sync time
over that of fusion at the default bucket size (medians over rounds): > 1
means the default fusion is faster. `paired_step_ratio` is the median over
rounds of the same ratio of whole step times, no subtraction (with its
quartiles): a sync of tens of microseconds (the classifier's) is within the
noise of the subtraction, so its `ratio` can even be negative; read its
paired_step_ratio. Before timing, each way's mean of one step is compared
with the float64 mean of the same gradients and with the per-leaf ring's,
bit for bit.

Trees: the parameters of configs/ds2_tiny.yaml's model, of
examples/classifier's, and of a small character transformer built from
flax.linen layers here (TransformerShapes: about 0.5 MB in 38 leaves).
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # models/ lives in the checkout, not the wheel
sys.path.insert(0, str(ROOT / "examples"))  # the classifier's config names classifier.task

from byte_sizes import parse_bytes  # noqa: E402

TREES = ("ds2_tiny", "classifier", "transformer")
NO_SYNC = "no_sync"
PER_LEAF = "per_leaf_ring"
PMEAN = "pmean"
FUSED_PREFIX = "fused:"
LEARNING_RATE = 1e-3  # small enough that the state stays finite over a run's steps


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8], help="host device counts (default 2 4 8)")
    parser.add_argument("--trees", nargs="+", choices=TREES, default=list(TREES))
    parser.add_argument("--bucket-bytes", type=parse_bytes, nargs="+", default=[64 << 10, 16 << 20],
                        help="bucket sizes timed besides the platform's default (default 64K 16M)")
    parser.add_argument("--rounds", type=int, default=7, help="timed loops of each way (median reported)")
    parser.add_argument("--steps", type=int, default=40, help="steps per loop")
    parser.add_argument("--quick", action="store_true",
                        help="the smallest case: 2 devices, the transformer, the default buckets only, 2 rounds of 8 steps")
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one device count: records go here
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.trees, args.bucket_bytes, args.rounds, args.steps = [2], ["transformer"], [], 2, 8
    return args


# -- the trees (shapes only: the values are drawn per device)

def transformer_shapes():
    """The parameter shapes of a small character-level transformer language model, from flax's layers."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class TransformerShapes(nn.Module):
        vocab: int = 96
        width: int = 64
        heads: int = 4
        layers: int = 2
        context: int = 128

        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(self.vocab, self.width)(tokens) + nn.Embed(self.context, self.width)(
                jnp.arange(tokens.shape[-1]))
            for _ in range(self.layers):
                x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(nn.LayerNorm()(x))
                x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
            return nn.Dense(self.vocab)(nn.LayerNorm()(x))

    tokens = jax.ShapeDtypeStruct((1, TransformerShapes.context), jnp.int32)
    return jax.eval_shape(TransformerShapes().init, jax.random.key(0), tokens)["params"]


def task_parameter_shapes(config_path: Path):
    """The parameter shapes of the task a config names, as its init makes them."""
    import jax

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.engine.experiment import build_task, load_config

    task = build_task(load_config(config_path, paths_relative_to=ROOT))
    return jax.eval_shape(task.init, jax.random.key(0))["params"]


def gradient_shapes(name: str):
    """The shape tree (jax.ShapeDtypeStruct leaves) of tree `name`, one of TREES."""
    configs = {"ds2_tiny": ROOT / "configs" / "ds2_tiny.yaml",
               "classifier": ROOT / "examples" / "classifier" / "classifier.yaml"}
    return transformer_shapes() if name == "transformer" else task_parameter_shapes(configs[name])


# -- the ways and the step

def sync_ways(bucket_sizes):
    """{way: mean over the pmap axis of a tree}, every way of the module docstring but no_sync."""
    import jax

    import jaxring
    from jaxring.engine.sync import Sync
    from jaxring.engine.task import AXIS

    ways = {f"{FUSED_PREFIX}{size}": Sync(1, "ring", size).mean for size in bucket_sizes}
    ways[PER_LEAF] = lambda tree: jaxring.allreduce(tree, AXIS, op="mean")
    ways[PMEAN] = lambda tree: jax.lax.pmean(tree, AXIS)
    return ways


def local_gradients(params, noise):
    """A step's gradients: computed from the state (so they change every step) and the device's own noise."""
    import jax

    return jax.tree_util.tree_map(lambda p, n: 0.5 * p + n, params, noise)


def step_program(mean, devices):
    """(params, noise) -> (params - LEARNING_RATE * mean(gradients), a scalar to wait on); params donated,
    as the engine's make_train_step. `mean` None: no mean, the step alone."""
    import jax

    from jaxring.engine.task import AXIS

    def step(params, noise):
        grads = local_gradients(params, noise)
        averaged = grads if mean is None else mean(grads)
        params = jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, averaged)
        return params, jax.tree_util.tree_leaves(params)[0].reshape(-1)[0]

    return jax.pmap(step, axis_name=AXIS, devices=devices, donate_argnums=0)


def random_inputs(shapes, devices, seed=0):
    """(params replicated over `devices`, noise different on each), float32 normal draws."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(devices)
    params = jax.tree_util.tree_map(lambda s: np.broadcast_to(rng.normal(size=s.shape).astype(s.dtype), (n, *s.shape)),
                                    shapes)
    noise = jax.tree_util.tree_map(lambda s: rng.normal(size=(n, *s.shape)).astype(s.dtype), shapes)
    return params, noise


def check_values(ways, params, noise, devices):
    """{way: (max |way - float64 mean| over max |mean|, bitwise equal to the per-leaf ring)} for one mean."""
    import jax
    import numpy as np

    from jaxring.engine.task import AXIS

    grads = jax.tree_util.tree_leaves(jax.pmap(local_gradients, devices=devices)(params, noise))
    reference = [np.asarray(g, np.float64).mean(axis=0) for g in grads]
    scale = max(np.abs(r).max() for r in reference)
    results = {way: [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(
        jax.pmap(lambda p, n, mean=mean: mean(local_gradients(p, n)), axis_name=AXIS, devices=devices)(params, noise))]
        for way, mean in ways.items()}
    checks = {}
    for way, leaves in results.items():
        error = max(np.abs(leaf - r[None]).max() for leaf, r in zip(leaves, reference)) / scale
        bitwise = all(np.array_equal(a, b) for a, b in zip(leaves, results[PER_LEAF]))
        checks[way] = (float(error), bitwise)
    return checks


def queued_loop(program, params, noise, steps):
    """A function that runs `steps` steps of `program` from where its last call left the state, the
    trainer's STEPS_IN_FLIGHT queued, and waits for all."""
    import jax

    from jaxring.engine.trainer import STEPS_IN_FLIGHT

    state = {"params": params}

    def run():
        in_flight = collections.deque()
        for _ in range(steps):
            state["params"], loss = program(state["params"], noise)
            in_flight.append(loss)
            if len(in_flight) > STEPS_IN_FLIGHT:
                in_flight.popleft().block_until_ready()
        jax.block_until_ready(list(in_flight))

    return run


def bench_tree(name, bucket_sizes, default_size, devices, rounds, steps):
    """The records of tree `name` on `devices`: every way timed, alternated."""
    import jax
    import numpy as np

    from ops_in_program import time_in_steady_state

    from jaxring.collectives.fusion import plan_buckets

    shapes = gradient_shapes(name)
    leaves = jax.tree_util.tree_leaves(shapes)
    params, noise = random_inputs(shapes, devices)
    ways = sync_ways(bucket_sizes)
    checks = check_values(ways, params, noise, devices)
    on_devices = jax.pmap(lambda tree: tree, devices=devices)  # each call's inputs stay on the devices
    noise = on_devices(noise)
    ways[NO_SYNC] = None
    loops = {way: queued_loop(step_program(mean, devices), on_devices(params), noise, steps)
             for way, mean in ways.items()}
    for run in loops.values():  # compiles
        run()
    seconds = {way: t / steps for way, t in time_in_steady_state(loops, rounds).items()}
    sync_s = {way: seconds[way] - seconds[NO_SYNC] for way in ways if way != NO_SYNC}
    default = f"{FUSED_PREFIX}{default_size}"
    records = []
    for way in sync_s:
        size = int(way[len(FUSED_PREFIX):]) if way.startswith(FUSED_PREFIX) else None
        error, bitwise = checks[way]
        records.append(dict(
            tree=name, n_devices=len(devices), leaves=len(leaves),
            bytes=int(sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)),
            way=way, bucket_bytes=size, default_bucket=size == default_size,
            collectives=len(plan_buckets(leaves, size)) if size else len(leaves),
            step_s=float(np.median(seconds[way])), no_sync_step_s=float(np.median(seconds[NO_SYNC])),
            sync_s=float(np.median(sync_s[way])),
            ratio=float(np.median(sync_s[way]) / np.median(sync_s[default])),
            paired_step_ratio=float(np.median(seconds[way] / seconds[default])),
            paired_step_ratio_quartiles=[float(q) for q in np.quantile(seconds[way] / seconds[default], [0.25, 0.75])],
            error_vs_float64=error, bitwise_equal_to_per_leaf_ring=bitwise,
        ))
    return records


def worker(args):
    """Every tree on this process's host devices; the records as JSON in args.worker."""
    import jax

    from jaxring.collectives.fusion import DEFAULT_BUCKET_BYTES, default_bucket_bytes

    devices = jax.local_devices()
    default_size = default_bucket_bytes(jax.default_backend())
    sizes = sorted({default_size, *args.bucket_bytes})
    records = [r for name in args.trees for r in bench_tree(name, sizes, default_size, devices, args.rounds, args.steps)]
    args.worker.write_text(json.dumps(dict(machine=machine(), default_bucket_bytes=DEFAULT_BUCKET_BYTES,
                                           records=records)))


def run_on_devices(n, argv, scratch: Path):
    """What a subprocess on `n` host devices found (its own XLA_FLAGS: JAX fixes the count at start):
    {machine, default_bucket_bytes, records}."""
    out = scratch / f"devices_{n}.json"
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={n}".strip())
    subprocess.run([sys.executable, __file__, *argv, "--worker", str(out)], env=env, check=True)
    return json.loads(out.read_text())


def machine():
    import platform

    import jax

    return dict(platform=jax.default_backend(), cpu_count=os.cpu_count(), processor=platform.processor(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), jax=jax.__version__)


def print_table(records):
    print(f"{'tree':<12} {'dev':>3} {'leaves':>6} {'bytes':>9} {'way':<16} {'colls':>5} {'step ms':>8} "
          f"{'sync ms':>8} {'ratio':>6} {'paired':>6} {'err/f64':>8} {'=ring':>5}")
    for r in records:
        print(f"{r['tree']:<12} {r['n_devices']:>3} {r['leaves']:>6} {r['bytes']:>9} {r['way']:<16} "
              f"{r['collectives']:>5} {r['step_s'] * 1e3:>8.3f} {r['sync_s'] * 1e3:>8.3f} {r['ratio']:>6.2f} "
              f"{r['paired_step_ratio']:>6.2f} {r['error_vs_float64']:>8.1e} {str(r['bitwise_equal_to_per_leaf_ring']):>5}")
    print("ratio: sync time over that of fusion at the default bucket size (> 1: the default fusion is faster)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        import jaxring  # noqa: F401  (before JAX starts: reserves the threads queued steps need)

        return worker(args)
    with tempfile.TemporaryDirectory(prefix="bench_fusion-") as scratch:
        runs = [run_on_devices(n, argv, Path(scratch)) for n in args.devices]
    records = [r for run in runs for r in run["records"]]
    print_table(records)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python", "scripts/bench/bench_fusion.py", *argv])
        args.json.write_text(json.dumps(dict(runs[0], command=command, records=records), indent=1))


if __name__ == "__main__":
    sys.exit(main())
