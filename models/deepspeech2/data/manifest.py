"""JSON-lines manifests: one {"audio_filepath", "duration", "text"} object per line.

Relative audio paths are resolved against the manifest's folder, so a corpus folder can be
moved or copied as a whole.
"""

import dataclasses
import json
import os

from models.deepspeech2.data import problems as P


@dataclasses.dataclass(frozen=True)
class Utterance:
    audio_filepath: str  # absolute after reading
    duration: float  # seconds
    text: str  # the transcript as written; normalised when the dataset is built


def read_manifest(path: str, problems: P.Problems | None = None) -> list[Utterance]:
    """Utterances of a manifest; lines that are not a valid entry are skipped and counted."""
    problems = problems or P.Problems()
    folder = os.path.dirname(os.path.abspath(path))
    utterances = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                utterances.append(Utterance(
                    audio_filepath=os.path.join(folder, entry["audio_filepath"]),
                    duration=float(entry["duration"]),
                    text=str(entry["text"]),
                ))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                problems.skip(P.BAD_MANIFEST_LINE, f"{path}:{number}",
                              f"{type(e).__name__}: {e}; expected "
                              '{"audio_filepath": str, "duration": float, "text": str}')
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
