"""N-gram language models in the ARPA format, for CTC beam search.

An ARPA file lists log10 probabilities of n-grams and log10 back-off weights of their
contexts; any n-gram tool (KenLM's lmplz, SRILM, scripts/build_lm.py) writes one. Two
kinds are read:

- word models (the usual kind, e.g. LibriSpeech's 3-gram): tokens are words; the beam
  search adds log p(word | previous words) when a word ends (a space or the end);
- character models: tokens are single characters, with SPACE standing for the space
  between words; the beam search adds log p(character | previous characters) as each
  character is typed. A file is a character model when SPACE is in its vocabulary.

train_witten_bell() estimates an interpolated Witten-Bell model from transcripts and
returns it as an ArpaLM, which write() saves: Witten-Bell's interpolation weight of a
context is exactly its back-off weight, so the ARPA file is the same model.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
SPACE = "<space>"  # a character model's token for " "
LOG10 = math.log(10)
# log10 probability of a token the model does not know and that has no <unk> entry
UNKNOWN_LOG10 = -10.0
# log10 probability ARPA tools write for <s>, which is never predicted
NEVER_LOG10 = -99.0


class ArpaError(ValueError):
    """An ARPA file that cannot be read; the message names the file and line."""


class ArpaLM:
    """A back-off n-gram model: ngrams maps a token tuple to (log10 prob, log10 back-off)."""

    def __init__(self, ngrams: dict[tuple[str, ...], tuple[float, float]]):
        if not ngrams:
            raise ValueError("a language model needs at least one n-gram")
        self.ngrams = ngrams
        self.order = max(len(ngram) for ngram in ngrams)
        self.vocabulary = {ngram[0] for ngram in ngrams if len(ngram) == 1}
        self.unit = "char" if SPACE in self.vocabulary else "word"
        self._cache: dict[tuple[tuple[str, ...], str], float] = {}

    # -- probabilities

    def log10_prob(self, context: Sequence[str], token: str) -> float:
        """log10 p(token | context) with ARPA back-off; context is the tokens before it
        (starting with BOS at the start of a sentence), cut to the last order - 1."""
        context = tuple(context[len(context) - self.order + 1:]) if self.order > 1 else ()
        key = (context, token)
        if key not in self._cache:
            if token not in self.vocabulary:
                token = UNK
            self._cache[key] = self._backoff(context, token)
        return self._cache[key]

    def _backoff(self, context: tuple[str, ...], token: str) -> float:
        if (entry := self.ngrams.get(context + (token,))) is not None:
            return entry[0]
        if not context:
            return UNKNOWN_LOG10  # only <unk> itself can get here, when the file has no <unk>
        weight = self.ngrams.get(context, (0.0, 0.0))[1]
        return weight + self._backoff(context[1:], token)

    def log_prob(self, context: Sequence[str], token: str) -> float:
        """Natural log p(token | context)."""
        return self.log10_prob(context, token) * LOG10

    def tokens(self, text: str) -> list[str]:
        """A transcript as this model's tokens (without BOS and EOS)."""
        return transcript_tokens(text, self.unit)

    def score(self, text: str) -> float:
        """Natural log probability of a whole transcript, end of sentence included."""
        history = [BOS]
        total = 0.0
        for token in self.tokens(text) + [EOS]:
            total += self.log_prob(history, token)
            history.append(token)
        return total

    # -- incremental scoring for prefix beam search

    def extend(self, prefix: str, symbol: str) -> float:
        """Natural log of what the LM adds when `symbol` is typed after the transcript `prefix`:
        a character model scores the character; a word model scores the word a space ends."""
        if self.unit == "char":
            return self.log_prob([BOS] + self.tokens(prefix), self.tokens(symbol)[0])
        if symbol != " " or not prefix or prefix.endswith(" "):
            return 0.0
        words = prefix.split()
        return self.log_prob([BOS] + words[:-1], words[-1])

    def finish(self, prefix: str) -> float:
        """Natural log of what the LM adds when the transcript ends after `prefix`."""
        tokens = [BOS] + self.tokens(prefix)
        if self.unit == "word" and prefix and not prefix.endswith(" "):
            return self.log_prob(tokens[:-1], tokens[-1]) + self.log_prob(tokens, EOS)
        return self.log_prob(tokens, EOS)

    # -- files

    @classmethod
    def read(cls, path) -> ArpaLM:
        """Reads an ARPA file (the \\data\\ counts, then each \\N-grams: section)."""
        ngrams: dict[tuple[str, ...], tuple[float, float]] = {}
        declared: dict[int, int] = {}
        section = None  # "data", an n-gram order, or None before \data\
        with open(path, encoding="utf-8") as f:
            for number, raw in enumerate(f, 1):
                line = raw.strip()
                where = f"{path}:{number}"
                if not line:
                    continue
                if line == "\\data\\":
                    section = "data"
                elif line == "\\end\\":
                    break
                elif line.startswith("\\") and line.endswith("-grams:"):
                    try:
                        section = int(line[1:-len("-grams:")])
                    except ValueError:
                        raise ArpaError(f"{where}: bad section header {line!r}") from None
                elif section == "data":
                    n, _, count = line.removeprefix("ngram ").partition("=")
                    try:
                        declared[int(n)] = int(count)
                    except ValueError:
                        raise ArpaError(f"{where}: expected 'ngram N=COUNT' in \\data\\, got {line!r}") from None
                elif isinstance(section, int):
                    ngrams.update([_parse_ngram(line, section, where)])
        if not declared:
            raise ArpaError(f"{path}: no \\data\\ section; is this an ARPA language model?")
        counts = collections.Counter(len(ngram) for ngram in ngrams)
        for n, count in declared.items():
            if counts[n] != count:
                raise ArpaError(f"{path}: \\data\\ declares {count} {n}-grams, the file lists {counts[n]}")
        return cls(ngrams)

    def write(self, path) -> None:
        by_order = collections.defaultdict(list)
        for ngram, entry in self.ngrams.items():
            by_order[len(ngram)].append((ngram, entry))
        with open(path, "w", encoding="utf-8") as f:
            f.write("\\data\\\n")
            for n in sorted(by_order):
                f.write(f"ngram {n}={len(by_order[n])}\n")
            for n in sorted(by_order):
                f.write(f"\n\\{n}-grams:\n")
                for ngram, (prob, backoff) in sorted(by_order[n]):
                    tail = f"\t{backoff:.7f}" if backoff != 0.0 else ""
                    f.write(f"{prob:.7f}\t{' '.join(ngram)}{tail}\n")
            f.write("\n\\end\\\n")


def _parse_ngram(line: str, order: int, where: str) -> tuple[tuple[str, ...], tuple[float, float]]:
    fields = line.split()
    if len(fields) not in (order + 1, order + 2):
        raise ArpaError(f"{where}: a {order}-gram line is 'log10prob w1 .. w{order} [backoff]', got {line!r}")
    try:
        prob = float(fields[0])
        backoff = float(fields[order + 1]) if len(fields) == order + 2 else 0.0
    except ValueError:
        raise ArpaError(f"{where}: probabilities must be numbers, got {line!r}") from None
    return tuple(fields[1:order + 1]), (prob, backoff)


def train_witten_bell(sentences: Iterable[Sequence[str]], order: int) -> ArpaLM:
    """Interpolated Witten-Bell n-gram model of token sentences (BOS and EOS are added).

    p(w | h) = (c(h w) + d(h) p(w | h')) / (c(h) + d(h)), with d(h) the number of distinct
    tokens seen after h, h' h without its first token, and a uniform distribution over the
    vocabulary (with <unk>) below the unigrams.
    """
    if order < 1:
        raise ValueError(f"n-gram order must be at least 1, got {order}")
    followers: dict[tuple[str, ...], collections.Counter] = collections.defaultdict(collections.Counter)
    for sentence in sentences:
        tokens = [BOS, *sentence, EOS]
        for i in range(1, len(tokens)):
            history = tokens[max(0, i - order + 1):i]
            for k in range(len(history) + 1):
                followers[tuple(history[len(history) - k:])][tokens[i]] += 1
    if not followers:
        raise ValueError("cannot train a language model on no sentences")
    vocabulary = set(followers[()]) | {UNK}
    uniform = 1.0 / len(vocabulary)
    probs: dict[tuple[str, ...], float] = {}

    def interpolated(context: tuple[str, ...], token: str) -> float:
        if (context + (token,)) in probs:
            return probs[context + (token,)]
        lower = interpolated(context[1:], token) if context else uniform
        seen = followers.get(context)
        if not seen:
            return lower
        return (seen.get(token, 0) + len(seen) * lower) / (sum(seen.values()) + len(seen))

    for context in sorted(followers, key=len):  # lower orders first: higher ones use them
        for token in followers[context]:
            probs[context + (token,)] = interpolated(context, token)
    probs.setdefault((UNK,), interpolated((), UNK))
    ngrams = {ngram: (math.log10(p), 0.0) for ngram, p in probs.items()}
    ngrams[(BOS,)] = (NEVER_LOG10, 0.0)
    for context, seen in followers.items():
        if context:
            weight = len(seen) / (sum(seen.values()) + len(seen))
            ngrams[context] = (ngrams[context][0], math.log10(weight))
    return ArpaLM(ngrams)


def transcript_tokens(text: str, unit: str) -> list[str]:
    """A normalised transcript as character tokens (SPACE between words) or words."""
    if unit == "char":
        return [SPACE if c == " " else c for c in text]
    if unit == "word":
        return text.split()
    raise ValueError(f"unit must be 'char' or 'word', got {unit!r}")
