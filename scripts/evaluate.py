"""Scores a trained Deep Speech 2 run: CER and WER (greedy decoding) as JSON.

    python scripts/evaluate.py --workdir runs/ds2_tiny                    # test split of its corpus
    python scripts/evaluate.py --workdir runs/ds2_tiny --manifest other.jsonl
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

    import jax

    import models
    from jaxring.engine.task import Shard
    from jaxring.engine.trainer import evaluate, make_predict, replicate

    try:
        config, task, variables, step = models.load_run(args.workdir, args.checkpoint)
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    manifest = args.manifest or task.manifests[args.split]
    batches = task.manifest_batches(manifest, args.batch_size or config.eval.batch_size, Shard(0, 1))
    devices = jax.local_devices()
    result = evaluate(task, make_predict(task), replicate(variables, devices), batches, len(devices))
    result = {**result, "step": step, "manifest": str(manifest)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
