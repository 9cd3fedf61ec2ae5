"""Scoring a run with prefix beam search and an ARPA language model: the `decode:` section.

scripts/train.py scores the test split with it after training (next to greedy decoding),
scripts/evaluate.py and transcribe.py take its settings as flags, and
scripts/fit_lm_weights.py picks alpha and beta on dev.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from pathlib import Path

from jaxring.engine.checkpoint import load_variables
from jaxring.engine.evaluation import score_batches
from jaxring.engine.task import Shard
from models.deepspeech2 import alphabet, ctc_decoders
from models.deepspeech2.data import read_manifest
from models.deepspeech2.lm import ArpaLM, train_witten_bell, transcript_tokens

TRAIN_LM = "train"  # decode.lm value: build the LM from the run's training transcripts
LM_FILE = "lm.arpa"  # where a run keeps the LM built from its training transcripts


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The `decode:` section of an experiment config."""

    beam_width: int = 0  # 0: greedy decoding only; > 0: test is also scored by beam search
    lm: str | None = None  # ARPA file, or "train": an n-gram of the training transcripts (RUN/lm.arpa)
    lm_unit: str = "word"  # lm "train": n-grams of "word"s or of "char"acters
    lm_order: int = 3  # lm "train": n-gram order
    alpha: float = 0.5  # weight of the LM's log probability (fit with scripts/fit_lm_weights.py)
    beta: float = 1.0  # bonus per word, against the LM's preference for few words

    def __post_init__(self):
        if self.beam_width < 0:
            raise ValueError(f"decode.beam_width must be >= 0, got {self.beam_width}")
        if self.lm_unit not in ("word", "char"):
            raise ValueError(f"decode.lm_unit must be 'word' or 'char', got {self.lm_unit!r}")
        if self.lm_order < 1:
            raise ValueError(f"decode.lm_order must be at least 1, got {self.lm_order}")


def build_lm(manifest: str, unit: str, order: int) -> ArpaLM:
    """Witten-Bell n-gram model of a manifest's normalised transcripts."""
    texts = [alphabet.normalize(u.text) for u in read_manifest(manifest)]
    sentences = [transcript_tokens(text, unit) for text in texts if text]
    return train_witten_bell(sentences, order)


def load_lm(path: str | None, workdir: str | Path, train_manifest: str, unit: str, order: int) -> ArpaLM | None:
    """The LM that `path` names: None, an ARPA file, or TRAIN_LM, which (re)builds
    WORKDIR/lm.arpa from the training transcripts."""
    if path is None:
        return None
    if path == TRAIN_LM:
        path = Path(workdir) / LM_FILE
        build_lm(train_manifest, unit, order).write(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"language model {path} does not exist; build one with scripts/build_lm.py")
    return ArpaLM.read(path)


def beam_decoder(beam_width: int, lm: ArpaLM | None, alpha: float, beta: float):
    """A task decoder (logits [B, T, 29], lengths [B]) -> transcripts, by prefix beam search."""
    return functools.partial(ctc_decoders.beam_decode, beam_width=beam_width, lm=lm,
                             alpha=alpha if lm is not None else 0.0, beta=beta)


def score_manifest(task, variables, manifest: str, batch_size: int, decoder=None, problems=None) -> dict:
    """CER, WER and utterances of `manifest` decoded by `decoder` (default: the task's own).

    `problems`: where unusable entries are counted (a data.Problems; default: a new one).
    """
    if decoder is not None:
        task = copy.copy(task)
        task.decoder = decoder
    return score_batches(task, variables, task.manifest_batches(manifest, batch_size, Shard(0, 1), problems=problems))


def lm_test_scores(task, config, workdir) -> dict:
    """The test split of a finished run (its best checkpoint) scored by the beam search and
    LM of its `decode:` section, as summary entries."""
    d = config.decode
    lm = load_lm(d.lm, workdir, task.manifests["train"], d.lm_unit, d.lm_order)
    variables, step = load_variables(workdir, "best")  # step: whose weights these are (a damaged best falls back)
    decoder = beam_decoder(d.beam_width, lm, d.alpha, d.beta)
    result = score_manifest(task, variables, task.manifests["test"], config.eval.batch_size, decoder)
    return {"test_beam_cer": result["cer"], "test_beam_wer": result["wer"], "test_beam_step": step, "beam_width": d.beam_width,
            "lm": None if lm is None else os.path.abspath(Path(workdir) / LM_FILE if d.lm == TRAIN_LM else d.lm),
            "alpha": d.alpha if lm is not None else None, "beta": d.beta}
