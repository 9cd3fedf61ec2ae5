"""Writes JSON-lines manifests (audio path, duration, transcript) for training on your own audio.

    python scripts/make_manifest.py --folder my_audio --split 0.8,0.1,0.1 --out data/mine
    python scripts/make_manifest.py --csv my_audio/list.csv --split 0.8,0.1,0.1 --out data/mine
    python scripts/make_manifest.py --librispeech LibriSpeech --subsets train-clean-100 --out data/ls --name train
    python scripts/train.py --config configs/ds2_tiny.yaml --set data.manifest_dir=data/mine

--folder: every audio file under the folder with its transcript in NAME.txt beside it.
--csv: a CSV with a header row and the columns path (relative to the CSV) and text.
--librispeech: <subset>/<speaker>/<chapter>/*.flac with <speaker>-<chapter>.trans.txt.
With --split TRAIN,DEV,TEST (fractions) the utterances are shuffled (--seed) and written to
OUT/train.jsonl, OUT/dev.jsonl and OUT/test.jsonl, the folder data.manifest_dir expects;
without it, all of them go to OUT/NAME.jsonl.
Audio paths in the manifests are relative to OUT (the rule of every manifest here), so
--folder and --out may be relative to the current directory.
Each file skipped (no transcript, unreadable audio, a transcript with digits or letters outside
a-z and ') is named on stderr with the reason, and a summary with what to do ends the output.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPLITS = ("train", "dev", "test")


def parse_fractions(text: str) -> dict[str, float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) != len(SPLITS) or min(values) <= 0 or abs(sum(values) - 1) > 1e-6:
        raise argparse.ArgumentTypeError(
            f"expected three positive fractions for train,dev,test that sum to 1 (e.g. 0.8,0.1,0.1); got {text!r}")
    return dict(zip(SPLITS, values))


def main(argv=None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--folder", help="audio files with a NAME.txt transcript beside each")
    source.add_argument("--csv", help="CSV with a header row and columns path, text")
    source.add_argument("--librispeech", help="LibriSpeech root (the folder holding the subset folders)")
    parser.add_argument("--subsets", nargs="+", help="--librispeech: subset folders to read (default: the root is one)")
    parser.add_argument("--out", required=True, type=Path, help="folder for the manifests (created)")
    parser.add_argument("--split", type=parse_fractions, help="train,dev,test fractions, e.g. 0.8,0.1,0.1")
    parser.add_argument("--name", default="all", help="manifest name without --split (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle before --split")
    args = parser.parse_args(argv)

    from models.deepspeech2.data import folders, librispeech, manifest
    from models.deepspeech2.data import problems as P

    problems = P.Problems(on_skip=lambda line: print(f"skipped {line}", file=sys.stderr, flush=True))
    try:
        if args.folder:
            utterances = folders.read_folder(args.folder, problems)
        elif args.csv:
            utterances = folders.read_csv(args.csv, problems)
        else:
            utterances = librispeech.read_librispeech(args.librispeech, args.subsets, problems)
        if not utterances:
            raise P.DataError(f"no usable utterance ({problems.summary()}).{problems.hints()}")
        parts = folders.split(utterances, args.split, args.seed) if args.split else {args.name: utterances}
    except (FileNotFoundError, ValueError) as e:  # DataError is a ValueError
        sys.exit(f"error: {e}")
    os.makedirs(args.out, exist_ok=True)
    for name, part in parts.items():
        path = args.out / f"{name}.jsonl"
        manifest.write_utterances(str(path), part)
        hours = sum(u.duration for u in part) / 3600
        print(f"{path}: {len(part)} utterances, {hours:.2f} h")
    print(P.describe(problems.counts) + problems.hints())
    return {name: len(part) for name, part in parts.items()}


if __name__ == "__main__":
    main()
