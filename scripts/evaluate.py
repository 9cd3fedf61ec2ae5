"""Scores a trained Deep Speech 2 run: CER and WER (greedy decoding) as JSON.

    python scripts/evaluate.py --workdir runs/ds2_tiny                    # test split of its corpus
    python scripts/evaluate.py --workdir runs/ds2_tiny --manifest other.jsonl

Each manifest line or audio file that cannot be scored gets one line on
stderr naming it and why; the others are still scored, and the exit status
is then 1.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory of scripts/train.py")
    parser.add_argument("--manifest", help="JSON-lines manifest to score (default: the run's --split)")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--checkpoint", default="best", help='"best" (by dev WER), "latest" or a step number')
    parser.add_argument("--batch-size", type=int, help="default: the run's eval.batch_size")
    args = parser.parse_args(argv)

    import dataclasses

    import jax

    import models
    from jaxring.engine.checkpoint import CheckpointError
    from jaxring.engine.task import Shard
    from jaxring.engine.trainer import evaluate, make_predict, replicate
    from models.deepspeech2.data import DataError, Problems

    try:
        config, task, variables, step = models.load_run(args.workdir, args.checkpoint)
    except (FileNotFoundError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    task.data = dataclasses.replace(task.data, max_unusable_share=1.0)  # score every usable utterance
    manifest = args.manifest or task.manifests[args.split]
    problems = Problems(on_skip=lambda line: print(f"skipped {line}", file=sys.stderr, flush=True))
    batches = task.manifest_batches(manifest, args.batch_size or config.eval.batch_size, Shard(0, 1), problems=problems)
    devices = jax.local_devices()
    try:
        result = evaluate(task, make_predict(task), replicate(variables, devices), batches, len(devices))
    except DataError as e:
        sys.exit(f"error: {e}")
    result = {**result, "step": step, "manifest": str(manifest), "skipped": len(problems.unusable)}
    print(json.dumps(result))
    if problems.unusable:
        sys.exit(f"error: {len(problems.unusable)} entries of {manifest} could not be scored ({problems.summary()})")
    return result


if __name__ == "__main__":
    main()
