"""Scores a trained Deep Speech 2 run: CER and WER as JSON, greedy or by beam search with an LM.

    python scripts/evaluate.py --workdir runs/ds2_tiny                    # test split of its corpus
    python scripts/evaluate.py --workdir runs/ds2_tiny --manifest other.jsonl
    python scripts/evaluate.py --workdir runs/ds2_tiny --beam-width 16 --lm runs/ds2_tiny/lm.arpa --alpha 0.5 --beta 1
    python scripts/evaluate.py --workdir runs/ds2_tiny_voices --split train --by synthesizer --per-group 400

Without --manifest it scores a split of the run's own data. For the synthetic
corpus, when that is not where the run's config.yaml says (a run directory
from another machine), the whole corpus is synthesised again first, and a
line on stderr says so. Each manifest line or audio file that cannot be
scored gets one line on stderr naming it and why; the others are still scored, and the exit status
is then 1. --by FIELD scores the manifest's utterances grouped by one of their
fields (a corpus of several synthesizers writes `synthesizer`, `voice`, `snr_db`, ...):
a result per value under "groups", each of its first --per-group utterances.
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
    parser.add_argument("--by", metavar="FIELD", help="score each value of this manifest field on its own")
    parser.add_argument("--per-group", type=int, help="with --by: the first N utterances of each value (default: all)")
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
        if args.by:
            result = {"by": args.by, "groups": {value: decoding.score_manifest(task, variables, part, batch_size,
                                                                                decoder, problems)
                                                for value, part in grouped(manifest, args.by, args.per_group)}}
        else:
            result = decoding.score_manifest(task, variables, manifest, batch_size, decoder, problems)
    except DataError as e:
        sys.exit(f"error: {e}")
    result = {**result, "step": step, "manifest": str(manifest), "skipped": len(problems.unusable), **described}
    print(json.dumps(result))
    if problems.unusable:
        sys.exit(f"error: {len(problems.unusable)} entries of {manifest} could not be scored ({problems.summary()})")
    return result


def grouped(manifest: str, field: str, per_group: int | None):
    """(value, manifest of its utterances) for each value of `field` in `manifest`, in sorted order: the
    first `per_group` utterances of each, in a temporary folder (removed once all are scored)."""
    import tempfile

    from models.deepspeech2.data import DataError

    folder = os.path.dirname(os.path.abspath(manifest))
    groups = {}
    with open(manifest, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                value = entry[field]
            except (json.JSONDecodeError, TypeError, KeyError):
                raise DataError(f"{manifest}:{number} is no JSON object with a field {field!r} for --by") from None
            rows = groups.setdefault(str(value), [])
            if per_group is None or len(rows) < per_group:
                if isinstance(entry.get("audio_filepath"), str):  # relative to the manifest's folder
                    entry["audio_filepath"] = os.path.join(folder, entry["audio_filepath"])
                rows.append(json.dumps(entry) + "\n")
    with tempfile.TemporaryDirectory(prefix="evaluate_by_") as parts:
        for index, value in enumerate(sorted(groups)):
            part = os.path.join(parts, f"{index}.jsonl")
            with open(part, "w", encoding="utf-8") as f:
                f.writelines(groups[value])
            yield value, part


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
