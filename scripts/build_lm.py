"""Builds an ARPA n-gram language model (Witten-Bell) of the transcripts of a manifest.

    python scripts/build_lm.py --manifest data/mine/train.jsonl --out data/mine/words3.arpa
    python scripts/build_lm.py --workdir runs/ds2_tiny --unit char --order 6 --out chars6.arpa

Transcripts are normalised like the model's labels (lower case a-z, space, apostrophe).
Use the LM with evaluate.py or transcribe.py --beam-width N --lm FILE, and fit its weights
with fit_lm_weights.py. Train it on the training split only: an LM that has seen the test
transcripts makes test scores meaningless.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", help="JSON-lines manifest whose transcripts to count")
    source.add_argument("--workdir", type=Path, help="a run directory: its training split's transcripts")
    parser.add_argument("--out", required=True, type=Path, help="ARPA file to write")
    parser.add_argument("--unit", choices=["word", "char"], default="word", help="n-grams of words or characters")
    parser.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    args = parser.parse_args(argv)

    from models.deepspeech2.beam_scoring import build_lm

    try:
        if args.workdir:
            import models  # noqa: F401  (registers deepspeech2)
            from jaxring.engine.experiment import build_task, load_config

            config = load_config(Path(args.workdir) / "config.yaml", paths_relative_to=ROOT)
            manifest = build_task(config).manifests["train"]
        else:
            manifest = args.manifest
        lm = build_lm(manifest, args.unit, args.order)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lm.write(args.out)
    sizes = {n: sum(len(g) == n for g in lm.ngrams) for n in range(1, lm.order + 1)}
    print(f"{args.out}: {args.unit} {args.order}-gram of {manifest}, "
          + ", ".join(f"{count} {n}-grams" for n, count in sizes.items()))
    return sizes


if __name__ == "__main__":
    main()
