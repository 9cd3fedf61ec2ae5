"""CTC decoding: greedy best path, and prefix beam search with an optional n-gram LM.

Beam search ranks a transcript y by Q(y) = log p_ctc(y | x) + alpha log p_lm(y)
+ beta word_count(y), as in the Deep Speech 2 paper; the LM is an ARPA file
(models/deepspeech2/lm.py), of words or of characters.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import scipy.special

from models.deepspeech2 import alphabet
from models.deepspeech2.lm import ArpaLM

NEG_INF = -math.inf


def greedy_decode(logits, out_lengths) -> list[str]:
    """Best path per utterance: argmax per frame, repeats merged, blanks dropped.

    logits [B, T, 29] (or log-probabilities), out_lengths [B] real frames.
    """
    best = np.asarray(logits).argmax(axis=-1)
    return [
        alphabet.decode([symbol for symbol, _ in itertools.groupby(best[i, :n])])
        for i, n in enumerate(np.asarray(out_lengths))
    ]


def _logaddexp(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    if b == NEG_INF:
        return a
    return a + math.log1p(math.exp(b - a))


def beam_search(
    log_probs,
    length: int | None = None,
    beam_width: int = 32,
    lm: ArpaLM | None = None,
    alpha: float = 0.0,
    beta: float = 0.0,
    prune: float = 1e-3,
) -> str:
    """Prefix beam search over one utterance's frames.

    log_probs [T, 29]: log-probabilities (logits are normalised here, which
    leaves log-probabilities unchanged); length: real frames (default T);
    prune: symbols below this probability in a frame are not tried (the
    frame's best symbol always is).
    """
    log_probs = np.asarray(log_probs, np.float64)
    if log_probs.ndim != 2 or log_probs.shape[1] != alphabet.SIZE:
        raise ValueError(f"log_probs must be [frames, {alphabet.SIZE}], got shape {log_probs.shape}")
    if beam_width < 1:
        raise ValueError(f"beam_width must be at least 1, got {beam_width}")
    if lm is None and alpha != 0.0:
        raise ValueError("alpha weights a language model; pass lm= or set alpha=0")
    length = log_probs.shape[0] if length is None else int(length)
    log_probs = scipy.special.log_softmax(log_probs[:length], axis=-1)

    # prefix -> [log p(prefix, path ends in blank), log p(prefix, path ends in its last symbol)]
    beams = {"": [0.0, NEG_INF]}
    lm_log_prob = {"": 0.0}

    def rank(item):
        prefix, (p_blank, p_symbol) = item
        words = len(prefix.split())
        return _logaddexp(p_blank, p_symbol) + alpha * lm_log_prob.get(prefix, 0.0) + beta * words

    for frame in log_probs:
        tried = np.flatnonzero(frame >= min(frame.max(), math.log(prune)))
        extended = collections.defaultdict(lambda: [NEG_INF, NEG_INF])
        for prefix, (p_blank, p_symbol) in beams.items():
            p_prefix = _logaddexp(p_blank, p_symbol)
            for index in tried:
                p = frame[index]
                if index == alphabet.BLANK:
                    entry = extended[prefix]
                    entry[0] = _logaddexp(entry[0], p_prefix + p)
                    continue
                symbol = alphabet.SYMBOLS[index]
                if prefix and symbol == prefix[-1]:
                    # Without a blank in between, a repeat merges into the same prefix;
                    # only paths ending in blank start a new copy of the symbol.
                    entry = extended[prefix]
                    entry[1] = _logaddexp(entry[1], p_symbol + p)
                    p_new = p_blank + p
                else:
                    p_new = p_prefix + p
                longer = prefix + symbol
                entry = extended[longer]
                entry[1] = _logaddexp(entry[1], p_new)
                if lm is not None and longer not in lm_log_prob:
                    lm_log_prob[longer] = lm_log_prob[prefix] + lm.extend(prefix, symbol)
        beams = dict(sorted(extended.items(), key=rank, reverse=True)[:beam_width])

    if lm is not None:
        for prefix in beams:
            lm_log_prob[prefix] = lm_log_prob[prefix] + lm.finish(prefix)
    return max(beams.items(), key=rank)[0]


def beam_decode(logits, out_lengths, **options) -> list[str]:
    """beam_search of every utterance of a batch: logits [B, T, 29], out_lengths [B];
    options as beam_search takes them (beam_width, lm, alpha, beta, prune)."""
    logits = np.asarray(logits)
    return [beam_search(logits[i], int(n), **options) for i, n in enumerate(np.asarray(out_lengths))]
