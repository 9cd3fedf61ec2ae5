"""JSON-lines manifests: one {"audio_filepath", "duration", "text"} object per line.

Relative audio paths are resolved against the manifest's folder, so a corpus folder can be
moved or copied as a whole.
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


def _missing_key_error(entry: dict, where: str) -> P.DataError | None:
    """A DataError naming the first required key `entry` lacks (and the present key it was
    probably meant to be), or None. A manifest with a wrong key has it on every line, so
    this stops the run instead of skipping every utterance."""
    for key in REQUIRED_KEYS:
        if key not in entry:
            unknown = [k for k in entry if k not in REQUIRED_KEYS]
            close = [k for k in unknown if k.lower() in OTHER_NAMES[key]] or difflib.get_close_matches(key, unknown, n=1)
            hint = f"; rename {close[0]!r} to {key!r}" if close else ""
            return P.DataError(
                f"{where}: no key {key!r} (keys: {sorted(entry)}){hint}. Every manifest line needs "
                '{"audio_filepath": str, "duration": seconds, "text": str}; '
                "scripts/make_manifest.py writes such manifests from audio folders."
            )
    return None


def read_manifest(path: str, problems: P.Problems | None = None) -> list[Utterance]:
    """Utterances of a manifest. Lines that are not valid JSON or hold a value of the wrong
    type are skipped and counted; a line without a required key raises DataError."""
    problems = problems or P.Problems()
    folder = os.path.dirname(os.path.abspath(path))
    utterances = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                problems.skip(P.BAD_MANIFEST_LINE, where, f"not JSON: {e}")
                continue
            if not isinstance(entry, dict):
                problems.skip(P.BAD_MANIFEST_LINE, where, f"a JSON {type(entry).__name__}, not an object")
                continue
            if error := _missing_key_error(entry, where):
                raise error
            try:
                utterances.append(Utterance(
                    audio_filepath=os.path.join(folder, entry["audio_filepath"]),
                    duration=float(entry["duration"]),
                    text=str(entry["text"]),
                ))
            except (TypeError, ValueError) as e:
                problems.skip(P.BAD_MANIFEST_LINE, where, f"{type(e).__name__}: {e}; expected "
                              '{"audio_filepath": str, "duration": seconds, "text": str}')
    return utterances


def write_manifest(path: str, entries: list[dict]) -> None:
    """Writes entries (dicts with at least audio_filepath, duration, text), paths made relative
    to the manifest's folder when they lie under it."""
    folder = os.path.dirname(os.path.abspath(path))
    with open(path, "w", encoding="utf-8") as f:
        for entry in entries:
            audio = os.path.abspath(os.path.join(folder, entry["audio_filepath"]))
            if audio.startswith(folder + os.sep):
                audio = os.path.relpath(audio, folder)
            f.write(json.dumps({**entry, "audio_filepath": audio}) + "\n")


def write_utterances(path: str, utterances: list[Utterance]) -> None:
    """Writes utterances as a manifest (durations rounded to 0.1 ms)."""
    write_manifest(path, [
        {"audio_filepath": u.audio_filepath, "duration": round(u.duration, 4), "text": u.text}
        for u in utterances
    ])
