"""The LibriSpeech layout: <subset>/<speaker>/<chapter>/<id>.flac with <speaker>-<chapter>.trans.txt."""

import glob
import os

from models.deepspeech2.data import audio
from models.deepspeech2.data import problems as P
from models.deepspeech2.data.manifest import Utterance, write_utterances


def read_librispeech(root: str, subsets: list[str] | None = None,
                     problems: P.Problems | None = None) -> list[Utterance]:
    """Utterances of LibriSpeech subsets under `root` (e.g. subsets=["train-clean-100"]).

    With subsets=None, `root` itself is read as one subset. Durations come from the flac
    headers; utterances whose audio is missing or unreadable are skipped and counted.
    """
    problems = problems or P.Problems()
    folders = [os.path.join(root, s) for s in subsets] if subsets else [root]
    utterances = []
    for folder in folders:
        transcripts = sorted(glob.glob(os.path.join(folder, "*", "*", "*.trans.txt")))
        if not transcripts:
            raise FileNotFoundError(
                f"no <speaker>/<chapter>/*.trans.txt under {folder}; point root at the folder "
                "that holds the subset folders (e.g. LibriSpeech/) and name the subsets"
            )
        for transcript in transcripts:
            utterances.extend(_read_chapter(transcript, problems))
    return utterances


def _read_chapter(transcript: str, problems: P.Problems) -> list[Utterance]:
    chapter = os.path.dirname(transcript)
    utterances = []
    with open(transcript, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            utterance_id, _, text = line.strip().partition(" ")
            path = os.path.join(chapter, utterance_id + ".flac")
            if not os.path.exists(path):
                problems.skip(P.MISSING_FILE, path, f"listed in {transcript}")
                continue
            try:
                seconds = audio.duration(path)
            except audio.AudioError as e:
                problems.skip(P.UNREADABLE_AUDIO, path, str(e))
                continue
            utterances.append(Utterance(path, seconds, text))
    return utterances


def write_librispeech_manifest(root: str, subsets: list[str], path: str) -> int:
    """Reads the subsets once and writes a JSON-lines manifest; returns the number of entries."""
    utterances = read_librispeech(root, subsets)
    write_utterances(path, utterances)
    return len(utterances)
