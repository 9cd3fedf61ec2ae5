"""Bad input accounting: a long run skips what it cannot use, counts it, and says so once an epoch."""

import collections
import threading

# Reasons an utterance is skipped.
MISSING_FILE = "missing file"
UNREADABLE_AUDIO = "unreadable audio"
EMPTY_TRANSCRIPT = "empty transcript"
UNKNOWN_CHARACTERS = "unknown characters"
TOO_LONG = "longer than max_duration"
LABELS_TOO_LONG = "labels longer than output frames"
BAD_MANIFEST_LINE = "bad manifest line"
# Repaired on the fly, counted but still used.
RESAMPLED = "resampled"


class DataError(ValueError):
    """Bad input met with strict=True; the message names the file and the reason."""


class Problems:
    """Counts skipped (and repaired) inputs; with strict=True the first skip raises DataError."""

    def __init__(self, strict: bool = False):
        self.strict = strict
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # utterances are loaded from several threads

    def skip(self, reason: str, source: str, detail: str = "") -> None:
        if self.strict:
            detail = f" ({detail})" if detail else ""
            raise DataError(
                f"{source}: {reason}{detail}. Fix or remove it, or run with strict=False "
                "to skip such inputs."
            )
        self.note(reason)

    def note(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    @property
    def skipped(self) -> int:
        return sum(n for reason, n in self.counts.items() if reason != RESAMPLED)

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.counts)


def describe(counts: collections.Counter[str]) -> str:
    """'skipped 3 (missing file: 1, unreadable audio: 2), resampled 4' or 'nothing skipped'."""
    skipped = {reason: n for reason, n in counts.items() if reason != RESAMPLED and n}
    parts = []
    if skipped:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(skipped.items()))
        parts.append(f"skipped {sum(skipped.values())} ({reasons})")
    else:
        parts.append("nothing skipped")
    if counts.get(RESAMPLED):
        parts.append(f"resampled {counts[RESAMPLED]}")
    return ", ".join(parts)
