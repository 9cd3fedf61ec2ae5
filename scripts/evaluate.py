"""Scores a trained Deep Speech 2 run: CER and WER as JSON, greedy or by beam search with an LM.

    python scripts/evaluate.py --workdir runs/ds2_tiny                    # test split of its corpus
    python scripts/evaluate.py --workdir runs/ds2_tiny --manifest other.jsonl
    python scripts/evaluate.py --workdir runs/ds2_tiny --beam-width 16 --lm runs/ds2_tiny/lm.arpa --alpha 0.5 --beta 1
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from decoder_flags import add_decoder_flags, decoder_of  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory of scripts/train.py")
    parser.add_argument("--manifest", help="JSON-lines manifest to score (default: the run's --split)")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--checkpoint", default="best", help='"best" (by dev WER), "latest" or a step number')
    parser.add_argument("--batch-size", type=int, help="default: the run's eval.batch_size")
    add_decoder_flags(parser)
    args = parser.parse_args(argv)

    import models
    from models.deepspeech2 import decoding

    try:
        config, task, variables, step = models.load_run(args.workdir, args.checkpoint)
        decoder, described = decoder_of(args, config)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    manifest = args.manifest or task.manifests[args.split]
    result = decoding.score_manifest(task, variables, manifest, args.batch_size or config.eval.batch_size, decoder)
    result = {**result, "step": step, "manifest": str(manifest), **described}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
