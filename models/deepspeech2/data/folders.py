"""Utterances from a folder of audio files: transcripts in a .txt beside each file, or in a CSV.

The inputs of scripts/make_manifest.py for data that is not in the LibriSpeech layout.
Durations come from the audio headers; files that cannot be read, and transcripts training would
refuse (digits, letters outside the alphabet), are skipped and counted.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from models.deepspeech2.data import audio
from models.deepspeech2.data import problems as P
from models.deepspeech2.data.dataset import lost_characters
from models.deepspeech2.data.manifest import Utterance

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".aiff", ".aif")
CSV_COLUMNS = ("path", "text")  # audio path (relative to the CSV's folder) and its transcript


def _utterance(path: str, text: str, problems: P.Problems) -> Utterance | None:
    """The utterance of audio `path` saying `text`; None (counted in `problems`) when training
    would refuse it: a transcript with digits or letters outside the alphabet, or unreadable audio."""
    if lost := lost_characters(text):
        in_order = "".join(c for c in dict.fromkeys(text.lower()) if c in lost)  # "42", not the sorted "24"
        problems.skip(P.UNKNOWN_CHARACTERS, path, f"{in_order!r} in transcript {text.strip()!r}")
        return None
    try:
        seconds = audio.duration(path)
    except audio.AudioError as e:
        problems.skip(P.UNREADABLE_AUDIO, path, str(e))
        return None
    return Utterance(path, seconds, text.strip())


def read_folder(folder: str, problems: P.Problems | None = None) -> list[Utterance]:
    """Every audio file under `folder` (recursively) that has a transcript NAME.txt beside it.

    Audio without a transcript is skipped as a missing transcript.
    """
    problems = problems or P.Problems()
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} is not a folder")
    utterances, seen = [], 0
    for root, dirs, files in os.walk(os.path.abspath(folder)):  # absolute: a manifest anywhere can point here
        dirs.sort()
        for name in sorted(files):
            stem, extension = os.path.splitext(name)
            if extension.lower() not in AUDIO_EXTENSIONS:
                continue
            seen += 1
            path = os.path.join(root, name)
            transcript = os.path.join(root, stem + ".txt")
            if not os.path.isfile(transcript):
                problems.skip(P.MISSING_TRANSCRIPT, path, f"no {transcript}")
                continue
            with open(transcript, encoding="utf-8") as f:
                if utterance := _utterance(path, f.read(), problems):
                    utterances.append(utterance)
    if not seen:
        raise FileNotFoundError(f"no audio files ({', '.join(AUDIO_EXTENSIONS)}) under {folder}")
    return utterances


def read_csv(path: str, problems: P.Problems | None = None) -> list[Utterance]:
    """Utterances listed in a CSV with a header row naming the columns `path` and `text`
    (others are ignored); relative audio paths are resolved against the CSV's folder."""
    problems = problems or P.Problems()
    folder = os.path.dirname(os.path.abspath(path))
    utterances = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise P.DataError(
                f"{path}:1: the header row has no column {', '.join(map(repr, missing))} "
                f"(it has {reader.fieldnames}); the CSV needs a header row with the columns "
                f"{', '.join(CSV_COLUMNS)}: the audio file and its transcript"
            )
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row["path"] or row["text"] is None:
                problems.skip(P.BAD_MANIFEST_LINE, where, "empty path or too few columns")
                continue
            audio_path = os.path.join(folder, row["path"])
            if not os.path.isfile(audio_path):
                problems.skip(P.MISSING_FILE, audio_path, f"listed in {where}")
                continue
            if utterance := _utterance(audio_path, row["text"], problems):
                utterances.append(utterance)
    return utterances


def split(utterances: list[Utterance], fractions: dict[str, float], seed: int = 0) -> dict[str, list[Utterance]]:
    """A seeded random partition into named parts of the given fractions (summing to 1);
    every part gets at least one utterance."""
    if abs(sum(fractions.values()) - 1) > 1e-6 or min(fractions.values()) <= 0:
        raise ValueError(f"split fractions must be positive and sum to 1; got {fractions}")
    if len(utterances) < len(fractions):
        raise ValueError(f"{len(utterances)} utterances cannot be split into {len(fractions)} non-empty parts")
    order = np.random.default_rng(seed).permutation(len(utterances))
    names = list(fractions)
    sizes = {name: max(1, round(fractions[name] * len(utterances))) for name in names[1:]}
    sizes[names[0]] = len(utterances) - sum(sizes.values())
    if sizes[names[0]] < 1:
        raise ValueError(f"{len(utterances)} utterances leave none for {names[0]!r} with fractions {fractions}")
    parts, start = {}, 0
    for name in names:
        parts[name] = [utterances[i] for i in sorted(order[start:start + sizes[name]])]
        start += sizes[name]
    return parts
