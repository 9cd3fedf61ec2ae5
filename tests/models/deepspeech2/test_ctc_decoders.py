"""Greedy and prefix beam search decoding (against brute force, with ARPA LMs), CER/WER."""

import itertools

import numpy as np
import pytest

from models.deepspeech2 import alphabet
from models.deepspeech2.ctc_decoders import beam_decode, beam_search, greedy_decode
from models.deepspeech2.lm import train_witten_bell, transcript_tokens
from models.deepspeech2.metrics import cer, wer

BLANK = alphabet.BLANK


def frames(*rows):
    """Log-probabilities [T, 29] from rows of {symbol: probability}; the rest is shared evenly."""
    out = np.empty((len(rows), alphabet.SIZE))
    for t, row in enumerate(rows):
        rest = max(1.0 - sum(row.values()), 1e-9) / (alphabet.SIZE - len(row))
        out[t] = rest
        for symbol, p in row.items():
            out[t, BLANK if symbol == "_" else alphabet.SYMBOLS.index(symbol)] = p
    return np.log(out)


def confident_path(path, p=0.97):
    """Frames whose best symbols spell `path` ('_' = blank)."""
    return frames(*({s: p} for s in path))


def test_greedy_merges_repeats_and_drops_blanks_within_length():
    a = confident_path("cc_aa_a_tt_")
    b = confident_path("h_ii_" + "z" * 6)  # frames past its length must be ignored
    logits = np.stack([a, b])
    assert greedy_decode(logits, [11, 5]) == ["caat", "hi"]
    assert greedy_decode(logits, [0, 1]) == ["", "h"]


def test_beam_search_sums_paths_that_greedy_splits():
    # Best path is "__" (0.36), but "a" collects a_ + _a + aa = 0.64.
    log_probs = frames({"_": 0.6, "a": 0.4}, {"_": 0.6, "a": 0.4})
    assert greedy_decode(log_probs[None], [2]) == [""]
    assert beam_search(log_probs, beam_width=4) == "a"


def test_beam_search_keeps_doubled_letters_apart_only_with_a_blank():
    assert beam_search(confident_path("_ll_"), beam_width=8) == "l"
    assert beam_search(confident_path("l_l"), beam_width=8) == "ll"
    assert beam_search(confident_path("see_d"), length=3, beam_width=8) == "se"


@pytest.mark.parametrize("seed", range(5))
def test_width_one_equals_greedy_on_confident_frames(seed):
    # With one beam, greedy and prefix search agree whenever each frame's best
    # symbol holds most of the probability, as in a trained model's output.
    rng = np.random.default_rng(seed)
    path = "".join(rng.choice(list("_abc "), size=25))
    log_probs = frames(*({s: rng.uniform(0.75, 0.99)} for s in path))
    assert beam_search(log_probs, beam_width=1) == greedy_decode(log_probs[None], [25])[0]


def char_lm(texts, order):
    return train_witten_bell([transcript_tokens(t, "char") for t in texts], order)


def word_lm(texts, order):
    return train_witten_bell([t.split() for t in texts], order)


def test_language_model_breaks_acoustic_ties():
    lm = char_lm(["the cat sat", "a cat", "cat"] * 5, order=3)
    log_probs = confident_path("c_o_t")
    log_probs[2] = frames({"o": 0.55, "a": 0.44})[0]
    assert beam_search(log_probs, beam_width=8) == "cot"
    assert beam_search(log_probs, beam_width=8, lm=lm, alpha=1.0) == "cat"


def test_word_bonus_favours_more_words():
    log_probs = confident_path("a_ _b")
    log_probs[2] = frames({"_": 0.55, " ": 0.44})[0]
    assert beam_search(log_probs, beam_width=8) == "ab"
    assert beam_search(log_probs, beam_width=8, beta=1.0) == "a b"


def test_beam_search_rejects_bad_arguments():
    with pytest.raises(ValueError, match="log_probs must be"):
        beam_search(np.zeros((3, 28)))
    with pytest.raises(ValueError, match="beam_width"):
        beam_search(np.zeros((3, 29)), beam_width=0)
    with pytest.raises(ValueError, match="pass lm="):
        beam_search(np.zeros((3, 29)), alpha=0.5)


def brute_force_best(log_probs, symbols, lm=None, alpha=0.0, beta=0.0):
    """argmax over transcripts y of log p_ctc(y) + alpha log p_lm(y) + beta words(y), with
    p_ctc(y) summed over every frame path (symbols: the only ones with probability)."""
    columns = [BLANK if s == "_" else alphabet.SYMBOLS.index(s) for s in symbols]
    totals = {}
    for path in itertools.product(range(len(symbols)), repeat=len(log_probs)):
        p = sum(log_probs[t, columns[i]] for t, i in enumerate(path))
        collapsed = [symbols[i] for i, _ in itertools.groupby(path)]
        text = "".join(s for s in collapsed if s != "_")
        totals[text] = np.logaddexp(totals.get(text, -np.inf), p)
    def q(text):
        return totals[text] + (alpha * lm.score(text) if lm else 0.0) + beta * len(text.split())
    return max(totals, key=q), q


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["none", "char", "word"])
def test_beam_search_equals_brute_force_on_tiny_logits(seed, kind):
    rng = np.random.default_rng([seed, len(kind)])
    symbols = "_ab "
    probs = rng.dirichlet(np.full(len(symbols), 0.7), size=5)
    log_probs = np.full((5, alphabet.SIZE), -np.inf)
    for i, s in enumerate(symbols):
        log_probs[:, BLANK if s == "_" else alphabet.SYMBOLS.index(s)] = np.log(probs[:, i])
    texts = ["ab", "a b", "ba", "b", "aab a", "b b b"]
    lm = {"none": None, "char": char_lm(texts, 3), "word": word_lm(texts, 2)}[kind]
    alpha, beta = (0.0, 0.3) if lm is None else (rng.uniform(0.3, 1.5), rng.uniform(-0.5, 1.0))
    expected, q = brute_force_best(log_probs, symbols, lm, alpha, beta)
    found = beam_search(log_probs, beam_width=1000, lm=lm, alpha=alpha, beta=beta, prune=1e-12)
    assert q(found) == pytest.approx(q(expected), abs=1e-9)


def test_beam_decode_decodes_each_utterance_within_its_length():
    logits = np.stack([confident_path("c_a_t"), confident_path("d_o_g")])
    assert beam_decode(logits, [5, 3], beam_width=4) == ["cat", "do"]


def test_error_rates():
    assert cer(["abc", "de"], ["abd", ""]) == pytest.approx(3 / 5)
    assert wer(["the cat sat", "on"], ["the bat sat", "on a"]) == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        cer(["a", "b"], ["a"])
