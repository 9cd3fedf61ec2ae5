"""JSON-lines manifests: one {"audio_filepath", "duration", "text"} object per line.

The one rule for paths: a relative audio path in a manifest is relative to the manifest's
folder (never to the directory a script runs from), and write_manifest (so
scripts/make_manifest.py) writes them that way. A corpus folder, or a checkout holding both
the manifests and the audio, can then be moved or copied as a whole.
"""

import dataclasses
import difflib
import json
import os

from models.deepspeech2.data import problems as P


@dataclasses.dataclass(frozen=True)
class Utterance:
    audio_filepath: str  # absolute after reading
    duration: float  # seconds
    text: str  # the transcript as written; normalised when the dataset is built


REQUIRED_KEYS = tuple(f.name for f in dataclasses.fields(Utterance))
# What other tools' manifests call the required keys, for the hint in a missing-key error.
OTHER_NAMES = {
    "audio_filepath": ("path", "audio", "file", "filename", "wav", "audio_path"),
    "duration": ("seconds", "length", "dur"),
    "text": ("transcript", "transcription", "sentence", "label"),
}


def _missing_key(entry: dict) -> str | None:
    """What required key `entry` lacks, and the present key it was probably meant to be; None if none."""
    for key in REQUIRED_KEYS:
        if key not in entry:
            unknown = [k for k in entry if k not in REQUIRED_KEYS]
            close = [k for k in unknown if k.lower() in OTHER_NAMES[key]] or difflib.get_close_matches(key, unknown, n=1)
            hint = f"; rename {close[0]!r} to {key!r} (scripts/make_manifest.py writes such manifests)" if close else ""
            return f"no key {key!r} (keys: {sorted(entry)}){hint}"
    return None


# No utterance is longer: a duration beyond this is a mistake in the manifest,
# and batching would size padded arrays from it (1e6 s is hundreds of GiB).
MAX_DURATION_S = 3600.0
_EXPECTED = '{"audio_filepath": str, "duration": seconds, "text": str}'


def read_manifest(path: str, problems: P.Problems | None = None) -> list[Utterance]:
    """Utterances of a manifest; lines that are not a valid entry are skipped and counted.

    A line without a required key is skipped with the key named (and the key it
    was probably meant to be), so the report says how to fix the manifest.
    Raises DataError if the file itself cannot be read.
    """
    problems = problems or P.Problems()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise P.DataError(f"manifest {path} cannot be read ({e.strerror or e}); check data.*_manifest") from None
    utterances = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            utterances.append(_parse_line(line, folder))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            problems.skip(P.BAD_MANIFEST_LINE, f"{path}:{number}", f"{type(e).__name__}: {e}; expected {_EXPECTED}")
    return utterances


def _parse_line(line: bytes, folder: str) -> Utterance:
    entry = json.loads(line.decode("utf-8"))
    if not isinstance(entry, dict):
        raise TypeError(f"a line is a JSON object, got {type(entry).__name__}")
    if missing := _missing_key(entry):
        raise ValueError(missing)
    duration = entry["duration"]
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError(f"duration must be a number of seconds, got {duration!r}")
    if not 0 < duration <= MAX_DURATION_S:  # also refuses NaN
        raise ValueError(f"duration {duration!r} is not in (0, {MAX_DURATION_S:g}] seconds")
    if not isinstance(entry["audio_filepath"], str) or not isinstance(entry["text"], str):
        raise TypeError("audio_filepath and text must be strings")
    return Utterance(
        audio_filepath=os.path.normpath(os.path.join(folder, entry["audio_filepath"])), duration=float(duration), text=entry["text"]
    )


def write_manifest(path: str, entries: list[dict]) -> None:
    """Writes entries (dicts with at least audio_filepath, duration, text; a relative
    audio_filepath already relative to the manifest's folder), each path made relative to the
    manifest's folder ("../clips/a.wav" included); only audio that shares no folder with the
    manifest but the filesystem root keeps its absolute path."""
    folder = os.path.dirname(os.path.abspath(path))
    with open(path, "w", encoding="utf-8") as f:
        for entry in entries:
            audio = os.path.abspath(os.path.join(folder, entry["audio_filepath"]))
            common = os.path.commonpath([audio, folder])
            if common != os.path.dirname(common):  # not the filesystem root
                audio = os.path.relpath(audio, folder)
            f.write(json.dumps({**entry, "audio_filepath": audio}) + "\n")


def write_utterances(path: str, utterances: list[Utterance]) -> None:
    """Writes utterances as a manifest (durations rounded to 0.1 ms)."""
    write_manifest(path, [
        {"audio_filepath": u.audio_filepath, "duration": round(u.duration, 4), "text": u.text}
        for u in utterances
    ])
