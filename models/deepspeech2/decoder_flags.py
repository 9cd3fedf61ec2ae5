"""Deep Speech 2's decoding flags of scripts/evaluate.py and transcribe.py: greedy, or beam search with an ARPA LM."""

import argparse
import os
from pathlib import Path

from models.deepspeech2 import beam_scoring
from models.deepspeech2.lm import ArpaLM


def add_decoder_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decoding (default: greedy)")
    group.add_argument("--beam-width", type=int, default=0, help="prefix beam search with this many beams")
    group.add_argument("--lm", help="ARPA n-gram language model (words or characters) for the beam search; "
                       "scripts/build_lm.py builds one, a run with decode.lm=train keeps its own in RUN/lm.arpa")
    group.add_argument("--alpha", type=float, help="LM weight (default: the run's decode.alpha)")
    group.add_argument("--beta", type=float, help="bonus per word (default: the run's decode.beta)")


def decoder_of(args, config):
    """(decoder or None for the task's greedy one, a dict describing it) from parsed flags;
    raises ValueError for flags that do not fit together."""
    if args.beam_width < 0:
        raise ValueError(f"--beam-width must be >= 0, got {args.beam_width}")
    if not args.beam_width:
        if args.lm or args.alpha is not None or args.beta is not None:
            raise ValueError("--lm, --alpha and --beta weight a beam search; add --beam-width (e.g. 16)")
        return None, {"decoder": "greedy"}
    lm = None
    if args.lm:
        try:
            lm = ArpaLM.read(args.lm)
        except FileNotFoundError:
            raise FileNotFoundError(f"--lm {args.lm} does not exist{_lm_hint(args)}") from None
    alpha = config.decode.alpha if args.alpha is None else args.alpha
    beta = config.decode.beta if args.beta is None else args.beta
    described = {"decoder": "beam", "beam_width": args.beam_width, "lm": os.path.abspath(args.lm) if args.lm else None,
                 "alpha": alpha if lm else None, "beta": beta}
    return beam_scoring.beam_decoder(args.beam_width, lm, alpha, beta), described


def _lm_hint(args) -> str:
    """Where to look instead: a relative --lm is relative to the current directory, and the run may have its own."""
    where = "" if os.path.isabs(args.lm) else f" (a relative path is relative to the current directory, {os.getcwd()})"
    own = Path(args.workdir) / beam_scoring.LM_FILE
    if own.is_file():
        return f"{where}; the run has its own LM: --lm {own.resolve()}"
    return f"{where}; build one with scripts/build_lm.py"
