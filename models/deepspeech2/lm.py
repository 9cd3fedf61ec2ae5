"""Character n-gram language model with interpolated Witten-Bell smoothing, for beam search."""

from __future__ import annotations

import collections
import json
import math

from models.deepspeech2 import alphabet

BOS = "^"  # pads the context before the first character
EOS = "$"  # end of transcript, predicted like a character
VOCABULARY = tuple(s for s in alphabet.SYMBOLS if s != alphabet.SYMBOLS[alphabet.BLANK]) + (EOS,)


class CharNGramLM:
    """P(next symbol | previous order-1 characters), over a-z, space, apostrophe and end."""

    def __init__(self, order: int, counts: dict[str, dict[str, int]]):
        if order < 1:
            raise ValueError(f"n-gram order must be at least 1, got {order}")
        self.order = order
        # counts[context][symbol], for every context length 0..order-1
        self.counts = counts
        self._totals = {h: sum(c.values()) for h, c in counts.items()}
        self._cache: dict[tuple[str, str], float] = {}

    @classmethod
    def train(cls, transcripts, order: int = 5) -> CharNGramLM:
        """Counts n-grams of normalised transcripts (see alphabet.normalize)."""
        counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for text in transcripts:
            unknown = alphabet.unknown_characters(text)
            if unknown:
                raise ValueError(
                    f"transcript {text!r} has characters {sorted(unknown)} outside the alphabet; "
                    "pass it through alphabet.normalize() first"
                )
            padded = BOS * (order - 1) + text + EOS
            for i in range(order - 1, len(padded)):
                for n in range(order):
                    counts[padded[i - n : i]][padded[i]] += 1
        if not counts:
            raise ValueError("cannot train a language model on no transcripts")
        return cls(order, {h: dict(c) for h, c in counts.items()})

    def log_prob(self, history: str, symbol: str) -> float:
        """Natural log P(symbol | history); history is the transcript so far, symbol a character or EOS."""
        context = (BOS * (self.order - 1) + history)[len(history) :]  # last order-1 characters
        key = (context, symbol)
        if key not in self._cache:
            self._cache[key] = math.log(self._prob(context, symbol))
        return self._cache[key]

    def _prob(self, context: str, symbol: str) -> float:
        if symbol not in VOCABULARY:
            raise ValueError(f"symbol {symbol!r} is not in the language model's vocabulary {VOCABULARY}")
        lower = self._prob(context[1:], symbol) if context else 1.0 / len(VOCABULARY)
        seen = self.counts.get(context)
        if not seen:
            return lower
        # Witten-Bell: the more distinct followers a context has, the more weight on the lower order.
        distinct = len(seen)
        total = self._totals[context]
        return (seen.get(symbol, 0) + distinct * lower) / (total + distinct)

    def score(self, text: str) -> float:
        """Natural log probability of a whole transcript, end included."""
        return sum(self.log_prob(text[:i], c) for i, c in enumerate(text)) + self.log_prob(text, EOS)

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump({"order": self.order, "counts": self.counts}, f)

    @classmethod
    def load(cls, path) -> CharNGramLM:
        with open(path) as f:
            data = json.load(f)
        return cls(data["order"], data["counts"])
