"""Bad input accounting: a long run skips what it cannot use, counts it, names the first few, and says so."""

import collections
import threading

from jaxring.engine import task

# Reasons an utterance is skipped.
MISSING_FILE = "missing file"
MISSING_TRANSCRIPT = "missing transcript"
UNREADABLE_AUDIO = "unreadable audio"
EMPTY_TRANSCRIPT = "empty transcript"
UNKNOWN_CHARACTERS = "unknown characters"
TOO_LONG = "longer than max_duration"
LABELS_TOO_LONG = "labels longer than output frames"
BAD_MANIFEST_LINE = "bad manifest line"
NON_FINITE_AUDIO = "non-finite audio samples"
# Repaired on the fly, counted but still used.
RESAMPLED = "resampled"
# Sources named per reason in reports; the rest are counted.
NAMED_PER_REASON = 3
# What to do about a reason, said once when inputs are refused for it.
HINTS = {
    MISSING_FILE: "a relative audio path in a manifest (or a CSV of scripts/make_manifest.py) is relative "
                  "to that file's folder, not to the current directory (make_manifest.py writes manifests so; "
                  "rerun it for a manifest written otherwise)",
    MISSING_TRANSCRIPT: "each audio file needs its transcript in a NAME.txt beside it",
    UNKNOWN_CHARACTERS: "transcripts may hold only a-z, space and apostrophe (other punctuation is dropped): "
                        "spell numbers and symbols out as words ('42' -> 'forty two', '%' -> 'percent')",
}


class DataError(task.DataError):
    """Bad input met with strict=True; the message names the file and the reason."""


class Problems:
    """Counts skipped (and repaired) inputs; with strict=True the first skip raises DataError.

    on_skip: called with a line "SOURCE: REASON (DETAIL)" the first time a source is skipped,
        e.g. to print each one.
    """

    def __init__(self, strict: bool = False, on_skip=None):
        self.strict = strict
        self.on_skip = on_skip
        self.counts: collections.Counter[str] = collections.Counter()
        self.first: dict[str, list[str]] = collections.defaultdict(list)  # reason -> first sources, with detail
        self.unusable: set[str] = set()  # distinct sources skipped (an epoch meets a bad file again)
        self._lock = threading.Lock()  # utterances are loaded from several threads

    def skip(self, reason: str, source: str, detail: str = "") -> None:
        if self.strict:
            detail = f" ({detail})" if detail else ""
            raise DataError(
                f"{source}: {reason}{detail}. Fix or remove it, or run with strict=False "
                "to skip such inputs."
            )
        with self._lock:
            new = source not in self.unusable
            self.counts[reason] += 1
            if new and len(self.first[reason]) < NAMED_PER_REASON:
                self.first[reason].append(f"{source} ({detail})" if detail else source)
            self.unusable.add(source)
        if new and self.on_skip is not None:
            self.on_skip(f"{source}: {reason}" + (f" ({detail})" if detail else ""))

    def note(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    @property
    def skipped(self) -> int:
        return sum(n for reason, n in self.counts.items() if reason != RESAMPLED)

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.counts)

    def report(self) -> dict[str, dict]:
        """{reason: {"count", "first": the first few sources}} of what was skipped."""
        with self._lock:
            return {reason: {"count": n, "first": list(self.first[reason])}
                    for reason, n in sorted(self.counts.items()) if reason != RESAMPLED}

    def summary(self) -> str:
        """describe() of the counts, then the first sources skipped for each reason."""
        named = "; ".join(f"{reason}: {', '.join(entry['first'])}" for reason, entry in self.report().items())
        return describe(self.snapshot()) + (f"; first: {named}" if named else "")

    def hints(self) -> str:
        """What to do about each reason met that has a hint, as sentences; '' if none."""
        return "".join(f" {reason.capitalize()}: {HINTS[reason]}." for reason in self.snapshot() if reason in HINTS)

    def check_share(self, total: int, max_share: float, what: str) -> None:
        """Raises DataError if no source of `total` is usable, or more than `max_share` of them are not."""
        with self._lock:
            bad = len(self.unusable)
        if bad < total and bad <= max_share * total:
            return
        raise DataError(
            f"{what}: {bad} of {total} utterances are unusable ({self.summary()}).{self.hints()} "
            f"Fix or remove them: that is more than the {max_share:.0%} allowed (data.max_unusable_share)"
        )


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
