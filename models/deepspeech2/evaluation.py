"""Deep Speech 2's part of scripts/evaluate.py: its options (a manifest, groups by a manifest field,
beam search with an LM) and its scoring, behind the Task contract's optional evaluation hooks
(jaxring/engine/task.py: add_evaluate_arguments, evaluate)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from models.deepspeech2 import beam_scoring
from models.deepspeech2.data import DataError, Problems
from models.deepspeech2.decoder_flags import add_decoder_flags, decoder_of


def add_evaluate_arguments(parser) -> None:
    group = parser.add_argument_group("Deep Speech 2")
    group.add_argument("--manifest", help="JSON-lines manifest to score (default: the run's --split: train, dev or "
                       "test of its corpus)")
    group.add_argument("--by", metavar="FIELD", help="score each value of this manifest field on its own")
    group.add_argument("--per-group", type=int, help="with --by: the first N utterances of each value (default: all)")
    add_decoder_flags(parser)


def evaluate(task, args, config, variables) -> tuple[dict, str | None]:
    """(CER and WER of the run's split or --manifest, an error to end with once they are printed, or None).

    Each manifest line or audio file that cannot be scored is named on stderr and skipped; the
    others are still scored, and the error then counts them. For the synthetic corpus, when it
    is not where the run's config.yaml says (a run directory from another machine), the whole
    corpus is synthesised again first, and a line on stderr says so.
    """
    if args.split not in ("train", "dev", "test"):
        raise DataError(f"--split {args.split!r}: Deep Speech 2 scores train, dev or test (or --manifest M.jsonl)")
    decoder, described = decoder_of(args, config)
    task.data = dataclasses.replace(task.data, max_unusable_share=1.0)  # score every usable utterance
    if not args.manifest:
        say_if_synthesising(task.data, args.workdir)
    manifest = args.manifest or task.manifests[args.split]
    problems = Problems(on_skip=lambda line: print(f"skipped {line}", file=sys.stderr, flush=True))
    batch_size = args.batch_size or config.eval.batch_size
    if args.by:
        result = {"by": args.by, "groups": {value: beam_scoring.score_manifest(task, variables, part, batch_size,
                                                                            decoder, problems)
                                            for value, part in grouped(manifest, args.by, args.per_group)}}
    else:
        result = beam_scoring.score_manifest(task, variables, manifest, batch_size, decoder, problems)
    result = {**result, "manifest": str(manifest), "skipped": len(problems.unusable), **described}
    failure = None
    if problems.unusable:
        failure = f"{len(problems.unusable)} entries of {manifest} could not be scored ({problems.summary()})"
    return result, failure


def grouped(manifest: str, field: str, per_group: int | None):
    """(value, manifest of its utterances) for each value of `field` in `manifest`, in sorted order: the
    first `per_group` utterances of each, in a temporary folder (removed once all are scored)."""
    import tempfile

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
