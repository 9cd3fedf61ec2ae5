"""Scores a trained Deep Speech 2 run: CER and WER as JSON, greedy or by beam search with an LM.

    python scripts/evaluate.py --workdir runs/ds2_tiny                    # test split of its corpus
    python scripts/evaluate.py --workdir runs/ds2_tiny --manifest other.jsonl
    python scripts/evaluate.py --workdir runs/ds2_tiny --beam-width 16 --lm runs/ds2_tiny/lm.arpa --alpha 0.5 --beta 1

Without --manifest it scores a split of the run's own data. For the synthetic
corpus, when that is not where the run's config.yaml says (a run directory
from another machine), the whole corpus is synthesised again first, and a
line on stderr says so. Each manifest line or audio file that cannot be
scored gets one line on stderr naming it and why; the others are still scored, and the exit status
is then 1.
"""

import argparse
import json
import os
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
    parser.add_argument("--checkpoint", default="best", help="best (by the run's checkpoint.best_metric, e.g. dev CER), latest or a step number")
    parser.add_argument("--batch-size", type=int, help="default: the run's eval.batch_size")
    add_decoder_flags(parser)
    args = parser.parse_args(argv)

    import dataclasses

    import models
    from jaxring.engine.checkpoint import CheckpointError
    from models.deepspeech2 import decoding
    from models.deepspeech2.data import DataError, Problems

    try:
        config, task, variables, step = models.load_run(args.workdir, args.checkpoint)
        decoder, described = decoder_of(args, config)
    except (FileNotFoundError, CheckpointError, ValueError) as e:
        sys.exit(f"error: {e}")
    task.data = dataclasses.replace(task.data, max_unusable_share=1.0)  # score every usable utterance
    if not args.manifest:
        say_if_synthesising(task.data, args.workdir)
    manifest = args.manifest or task.manifests[args.split]
    problems = Problems(on_skip=lambda line: print(f"skipped {line}", file=sys.stderr, flush=True))
    batch_size = args.batch_size or config.eval.batch_size
    try:
        result = decoding.score_manifest(task, variables, manifest, batch_size, decoder, problems)
    except DataError as e:
        sys.exit(f"error: {e}")
    result = {**result, "step": step, "manifest": str(manifest), "skipped": len(problems.unusable), **described}
    print(json.dumps(result))
    if problems.unusable:
        sys.exit(f"error: {len(problems.unusable)} entries of {manifest} could not be scored ({problems.summary()})")
    return result


def say_if_synthesising(data, workdir: Path) -> None:
    """A line on stderr before the run's synthetic corpus is generated again (minutes for a large
    one): it is missing when the run directory came from another machine or checkout."""
    from jaxring.engine.progress import timestamp
    from models.deepspeech2.data.synth import corpus_folder

    if data.source != "synthetic":
        return
    folder = corpus_folder(data.cache_dir, data.utterances, data.corpus_seed)
    if not os.path.isdir(folder):
        print(f"{timestamp()} the run's corpus is not in {folder} (data.cache_dir of {workdir / 'config.yaml'}): "
              f"synthesising all {data.utterances} utterances (its splits are cut from one sequence), "
              "about 3 s per 1,000 on 2 cores; --manifest M.jsonl scores other data instead",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
