"""Where a config's training-step compile time goes: tracing, lowering and XLA's compile, per model variant.

    python scripts/bench/compile_time.py --config ds2_paper --batch-size 256 --seconds 4 --json runs/compile_time.json

Times jax.jit(value_and_grad(task.loss)) for the config and for variants of it
(model.KEY=VALUE overrides: fewer recurrent layers, the scan unrolled, another
dtype), each split into trace + lower to StableHLO and XLA's compile, on this
machine's default backend. The variants' differences say which part of the
model the time scales with (docs/PERSISTENT_RNN.md, "Compile time").
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_train import random_batch  # noqa: E402  (scripts/bench/ is on the path of a script)

# The bound on ds2_paper's compile at batch 256 on a GPU (docs/PERSISTENT_RNN.md),
# judged by scripts/gpu/gpu_check_summary.py.
TARGET_S = 30


def time_compile(config, batch) -> dict:
    import jax

    from jaxring.engine.experiment import build_task
    from jaxring.engine.task import AXIS

    task = build_task(config)
    variables = task.init(jax.random.key(0))

    def loss(params, batch, rng):
        return task.loss({**variables, "params": params}, batch, rng)

    # Over one device, as the trainer's pmapped step: batch norm sums over the replica axis.
    step = jax.pmap(jax.value_and_grad(loss, has_aux=True), axis_name=AXIS)
    one_replica = jax.tree.map(lambda a: a[None], (variables["params"], batch, jax.random.key(1)))
    start = time.perf_counter()
    lowered = step.lower(*one_replica)
    lowered_s = time.perf_counter() - start
    start = time.perf_counter()
    lowered.compile()
    return {"trace_and_lower_s": lowered_s, "compile_s": time.perf_counter() - start,
            "stablehlo_chars": len(lowered.as_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="ds2_paper")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--variants", nargs="+", default=["as-is", "rnn_layers=1", "scan_unroll=4", "dtype=bfloat16"],
                        help="'as-is' or a model.KEY=VALUE override each")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import jax

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.engine.experiment import load_config

    batch = random_batch(args.batch_size, args.seconds)
    records = []
    for variant in args.variants:
        overrides = [] if variant == "as-is" else [f"model.{variant}"]
        config = load_config(ROOT / "configs" / f"{args.config}.yaml", overrides, ROOT)
        record = {"config": args.config, "variant": variant, "platform": jax.default_backend(),
                  "batch_size": args.batch_size, "seconds": args.seconds, **time_compile(config, batch)}
        print(json.dumps(record), flush=True)
        records.append(record)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        as_is = [r for r in records if r["variant"] == "as-is"]
        targets = {f"{args.config}_b{args.batch_size}_compile_s<={TARGET_S}":
                   as_is[0]["trace_and_lower_s"] + as_is[0]["compile_s"]} if as_is else {}
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d", time.gmtime()), "records": records,
                                         "targets": targets}, indent=2))


if __name__ == "__main__":
    main()
