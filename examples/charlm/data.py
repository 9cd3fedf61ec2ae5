"""English-like text from a seeded grammar: the same characters on every machine, nothing downloaded.

The grammar gives the text structure at several ranges for a model to learn:
spelling within words, "a"/"an" before the next word's first letter, the
verb agreeing with its subject across adjectives, phrases and relative
clauses, capitals after a full stop, "?" after a question's inverted start.
Words are drawn with Zipf-like weights, as in real text. Python's
random.Random gives the same draws from the same seed (an integer or a
string) on every platform.
"""

from __future__ import annotations

import functools
import itertools
import math
import random

import numpy as np

SPLITS = ("train", "dev", "test")
SPLIT_SHARES = {"train": 0.9, "dev": 0.05, "test": 0.05}  # of the characters

NOUNS = [  # (singular, plural)
    ("fox", "foxes"), ("hen", "hens"), ("owl", "owls"), ("cat", "cats"), ("dog", "dogs"), ("child", "children"),
    ("farmer", "farmers"), ("river", "rivers"), ("eagle", "eagles"), ("mouse", "mice"), ("queen", "queens"),
    ("wolf", "wolves"), ("apple", "apples"), ("island", "islands"), ("teacher", "teachers"), ("box", "boxes"),
    ("ox", "oxen"), ("baker", "bakers"), ("garden", "gardens"), ("umbrella", "umbrellas"),
]
VERBS = [  # (with a singular subject, with a plural one; both present tense)
    ("sees", "see"), ("chases", "chase"), ("likes", "like"), ("finds", "find"), ("watches", "watch"),
    ("carries", "carry"), ("follows", "follow"), ("hides", "hide"), ("feeds", "feed"), ("knows", "know"),
    ("visits", "visit"), ("admires", "admire"),
]
ADJECTIVES = ["old", "red", "small", "quiet", "happy", "big", "clever", "green", "angry", "young", "odd", "empty",
              "brave", "idle", "lazy", "bright"]
PREPOSITIONS = ["near", "behind", "under", "with", "beside", "above", "inside"]
ADVERBS = ["today", "again", "slowly", "at night", "every day", "quickly", "in the morning"]
NAMES = ["Ada", "Ben", "Eve", "Ivan", "Otto", "Una", "Kim", "Lea"]
SINGULAR_DETERMINERS = ["the", "a", "this", "every", "one"]  # "a" becomes "an" before a vowel
PLURAL_DETERMINERS = ["the", "some", "these", "many", "two", "three", "all the"]
CONJUNCTIONS = ["and", "but", "because", "while"]


@functools.cache
def _zipf_cumulative_weights(n: int) -> list[float]:
    return list(itertools.accumulate(1 / (k + 1) for k in range(n)))


def _zipf(rng: random.Random, words: list):
    """One of `words`, the k-th (from 0) drawn with weight 1 / (k + 1)."""
    return rng.choices(words, cum_weights=_zipf_cumulative_weights(len(words)))[0]


def _noun_phrase(rng: random.Random, plural: bool, depth: int) -> str:
    if not plural and rng.random() < 0.1:
        return _zipf(rng, NAMES)
    words = [_zipf(rng, ADJECTIVES) for _ in range(rng.choice((0, 0, 1, 1, 2)))]
    words.append(_zipf(rng, NOUNS)[plural])
    determiner = _zipf(rng, PLURAL_DETERMINERS if plural else SINGULAR_DETERMINERS)
    if determiner == "a" and words[0][0] in "aeiou":
        determiner = "an"
    phrase = " ".join([determiner, *words])
    if depth < 2 and rng.random() < 0.2:
        phrase += f" {_zipf(rng, PREPOSITIONS)} {_noun_phrase(rng, rng.random() < 0.4, depth + 1)}"
    if depth < 2 and rng.random() < 0.15:  # the relative clause's verb agrees with this phrase's noun
        phrase += f" that {_verb_phrase(rng, plural, depth + 1)}"
    return phrase


def _verb_phrase(rng: random.Random, plural: bool, depth: int) -> str:
    if rng.random() < 0.15:
        return f"{'are' if plural else 'is'} {_zipf(rng, ADJECTIVES)}"
    phrase = f"{_zipf(rng, VERBS)[plural]} {_noun_phrase(rng, rng.random() < 0.4, depth)}"
    return phrase + (f" {_zipf(rng, ADVERBS)}" if rng.random() < 0.25 else "")


def _clause(rng: random.Random) -> str:
    plural = rng.random() < 0.4
    return f"{_noun_phrase(rng, plural, 0)} {_verb_phrase(rng, plural, 0)}"


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.15:  # a question: "does" or "do" agrees with the subject that follows it
        plural = rng.random() < 0.4
        verb = _zipf(rng, VERBS)[1]  # after "does"/"do" the verb takes its plain form
        text = f"{'do' if plural else 'does'} {_noun_phrase(rng, plural, 1)} {verb} {_noun_phrase(rng, False, 1)}?"
    else:
        text = _clause(rng)
        if rng.random() < 0.3:
            text += f"{',' if rng.random() < 0.5 else ''} {_zipf(rng, CONJUNCTIONS)} {_clause(rng)}"
        text += "."
    return text[0].upper() + text[1:]


def make_text(chars: int, seed: int | str) -> str:
    """At least `chars` characters of sentences, a paragraph (a new line) every 1 to 6 of them."""
    rng = random.Random(seed)
    paragraphs, total = [], 0
    while total < chars:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(1, 6))) + "\n"
        paragraphs.append(paragraph)
        total += len(paragraph)
    return "".join(paragraphs)


def _alphabet() -> str:
    """Every character the grammar can write, sorted: the vocabulary, fixed by the word lists alone."""
    words = [*sum(NOUNS, ()), *sum(VERBS, ()), *ADJECTIVES, *PREPOSITIONS, *ADVERBS, *NAMES,
             *SINGULAR_DETERMINERS, *PLURAL_DETERMINERS, *CONJUNCTIONS, "an", "is", "are", "that", "does", "do"]
    letters = set("".join(words))
    return "".join(sorted(letters | {c.upper() for c in letters} | set(" .,?\n")))


ALPHABET = _alphabet()


def encode(text: str) -> np.ndarray:
    """The text as uint8 indices into ALPHABET."""
    table = np.full(128, 255, np.uint8)
    table[np.frombuffer(ALPHABET.encode("ascii"), np.uint8)] = np.arange(len(ALPHABET))
    return table[np.frombuffer(text.encode("ascii"), np.uint8)]


def make_splits(chars: int, seed: int) -> dict[str, np.ndarray]:
    """{split: uint8 codes}: at least `chars` characters in all, each split (SPLIT_SHARES) a text of its own
    from its own seed (none is empty)."""
    return {split: encode(make_text(math.ceil(share * chars), f"{seed}/{split}"))
            for split, share in SPLIT_SHARES.items()}


def unigram_entropy(codes: np.ndarray) -> float:
    """Bits per character of the characters' own frequencies: what a model that ignores context achieves at best."""
    counts = np.bincount(codes, minlength=len(ALPHABET))
    shares = counts[counts > 0] / len(codes)
    return -math.fsum(shares * np.log2(shares))
