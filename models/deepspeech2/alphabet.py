"""The 29-symbol output alphabet of Deep Speech 2: blank, a-z, space, apostrophe."""

import re
import unicodedata

import numpy as np

BLANK = 0
SYMBOLS = ("<blank>",) + tuple("abcdefghijklmnopqrstuvwxyz") + (" ", "'")
SIZE = len(SYMBOLS)  # 29

_INDEX = {symbol: i for i, symbol in enumerate(SYMBOLS) if i != BLANK}
_NOT_IN_ALPHABET = re.compile(r"[^a-z' ]")
_SPACES = re.compile(r" +")


def normalize(text: str) -> str:
    """Lower-cases, folds accents and curly quotes, maps '-' to space, drops other symbols."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = text.lower().replace("`", "'").replace("-", " ")
    text = _NOT_IN_ALPHABET.sub("", text)
    return _SPACES.sub(" ", text).strip()


def unknown_characters(text: str) -> set[str]:
    """Characters of `text` (lower-cased) that the alphabet cannot represent."""
    return {c for c in text.lower() if c not in _INDEX}


def encode(text: str) -> np.ndarray:
    """Label ids (1..28) of an already normalised transcript."""
    try:
        return np.array([_INDEX[c] for c in text], dtype=np.int32)
    except KeyError as e:
        raise ValueError(
            f"transcript {text!r} has character {e.args[0]!r} outside the alphabet; "
            "pass it through alphabet.normalize() first"
        ) from None


def decode(ids) -> str:
    """Text of label ids; blanks are dropped (no CTC collapsing here)."""
    return "".join(SYMBOLS[i] for i in ids if i != BLANK)
