"""Transcribes audio files with a trained Deep Speech 2 run, one line per file.

    python scripts/transcribe.py --workdir runs/ds2_tiny a.flac b.wav
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory of scripts/train.py")
    parser.add_argument("audio", nargs="+", help="audio files (any format libsndfile reads, any sample rate)")
    parser.add_argument("--checkpoint", default="best", help='"best" (by dev WER), "latest" or a step number')
    args = parser.parse_args(argv)
    missing = [path for path in args.audio if not Path(path).is_file()]
    if missing:
        sys.exit(f"error: no such audio file: {', '.join(missing)}")

    import models

    try:
        _, task, variables, _ = models.load_run(args.workdir, args.checkpoint)
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    transcripts = task.transcribe(variables, args.audio)
    for text in transcripts:
        print(text)
    return transcripts


if __name__ == "__main__":
    main()
