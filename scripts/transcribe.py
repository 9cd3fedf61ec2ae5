"""Transcribes audio files with a trained Deep Speech 2 run: one line per file, "FILE<tab>TRANSCRIPT".

    python scripts/transcribe.py --workdir runs/ds2_tiny a.flac b.wav
    python scripts/transcribe.py --workdir runs/ds2_tiny --beam-width 16 --lm runs/ds2_tiny/lm.arpa a.flac

Every file gets its line on stdout, in the order given (`cut -f2` keeps the
transcripts). A file that cannot be used gets "FILE<tab>error: WHY" there
instead (a transcript never holds a colon), and the same on stderr; the
others are still transcribed, and the exit status is then 1.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.deepspeech2.decoder_flags import add_decoder_flags, decoder_of  # noqa: E402


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory of scripts/train.py")
    parser.add_argument("audio", nargs="+", help="audio files (any format libsndfile reads, any sample rate)")
    parser.add_argument("--checkpoint", default="best", help="best (by the run's checkpoint.best_metric, e.g. dev CER), latest or a step number")
    add_decoder_flags(parser)
    args = parser.parse_args(argv)

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.engine.checkpoint import CheckpointError
    from jaxring.engine.experiment import load_run
    from models.deepspeech2.data import DataError

    try:
        config, task, variables, _ = load_run(args.workdir, args.checkpoint, ROOT)
        decoder, _ = decoder_of(args, config)
    except (FileNotFoundError, CheckpointError, ValueError) as e:
        sys.exit(f"error: {e}")
    if decoder is not None:
        task.decoder = decoder
    errors = {}
    for path in args.audio:
        try:
            task.audio_features(path)
        except DataError as e:
            errors[path] = str(e)
    usable = [path for path in args.audio if path not in errors]
    transcripts = dict(zip(usable, task.transcribe(variables, usable) if usable else []))
    for path in args.audio:
        if path in errors:
            print(f"{path}\terror: {errors[path].removeprefix(f'{path}: ')}", flush=True)
            print(f"error: {errors[path]}", file=sys.stderr, flush=True)
        else:
            print(f"{path}\t{transcripts[path]}", flush=True)
    if errors:
        sys.exit(1)
    return [transcripts[path] for path in args.audio]


if __name__ == "__main__":
    main()
