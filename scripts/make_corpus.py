"""Synthesises the default speech corpus with eSpeak NG.

    python scripts/make_corpus.py --out data/espeak --utterances 8000 --seed 0

writes DIR/audio/{train,dev,test}/*.flac and DIR/{train,dev,test}.jsonl; dev and test are
spoken by voices training never hears.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from models.deepspeech2.data import synth  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder to create (must not exist or be empty)")
    parser.add_argument("--utterances", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None,
                        help="processes (default: one per ~500 utterances, at most one per core)")
    args = parser.parse_args()
    if os.path.isdir(args.out) and os.listdir(args.out):
        parser.error(f"{args.out} exists and is not empty; choose a new folder")
    start = time.perf_counter()
    synth.generate_corpus(args.out, args.utterances, args.seed, args.workers)
    seconds = time.perf_counter() - start
    sizes = synth.split_sizes(args.utterances)
    print(f"{args.utterances} utterances ({', '.join(f'{k} {v}' for k, v in sizes.items())}) "
          f"in {seconds:.1f} s ({args.utterances / seconds:.0f}/s) -> {args.out}")


if __name__ == "__main__":
    main()
