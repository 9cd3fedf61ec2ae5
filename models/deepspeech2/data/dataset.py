"""A validated list of utterances: what can be checked from metadata is checked once, up
front; what needs the audio is checked when an utterance is loaded."""

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from models.deepspeech2 import alphabet
from models.deepspeech2.data import audio, features
from models.deepspeech2.data import problems as P
from models.deepspeech2.data.manifest import Utterance


def lost_characters(text: str) -> set[str]:
    """Letters and digits that normalisation would drop (e.g. '7', 'ß', 'ж'): the transcript
    would no longer say what the audio says. Punctuation is dropped on purpose and is fine."""
    return {c for c in alphabet.unknown_characters(text) if c.isalnum() and not alphabet.normalize(c)}


def ctc_min_frames(labels: np.ndarray) -> int:
    """Fewest output frames CTC needs: one per label plus a blank between repeated labels."""
    return len(labels) + int(np.sum(labels[1:] == labels[:-1]))


@dataclasses.dataclass
class Example:
    features: np.ndarray  # [frames, num_features] float32
    labels: np.ndarray  # [length] int32
    text: str


class SpeechDataset:
    """Utterances that passed the metadata checks, with their normalised text and labels.

    output_frames: the model's output length for a number of input frames; utterances whose
        labels CTC cannot fit into it are skipped. None skips no such utterance.
    max_duration: longer utterances (seconds) are skipped; None keeps all.
    strict: raise DataError at the first bad utterance instead of skipping it.
    problems: where skips are counted (default: a new Problems(strict); a given one keeps
        its own strictness).
    max_unusable_share: raise DataError as soon as more than this share of the entries
        turns out unusable (here or while loading), or none is usable; None: never.
    entries: how many entries the utterances came from, counting manifest lines that made
        none (counted in `problems`); default len(utterances).
    name: what error messages call this dataset (e.g. "manifest PATH").
    num_features: the model's input features per frame (features.featurize).
    """

    def __init__(self, utterances: Sequence[Utterance], *, max_duration: float | None = None,
                 output_frames: Callable[[int], int] | None = None, strict: bool = False,
                 problems: P.Problems | None = None, max_unusable_share: float | None = None,
                 entries: int | None = None, name: str = "the dataset",
                 num_features: int = features.NUM_BINS):
        self.num_features = num_features
        self.problems = problems or P.Problems(strict)
        self.output_frames = output_frames
        self.total = len(utterances) if entries is None else entries
        self.max_unusable_share = max_unusable_share
        self.name = name
        kept = [u for u in utterances if self._usable(u, max_duration)]
        self.paths = [u.audio_filepath for u in kept]
        self.durations = np.array([u.duration for u in kept], dtype=np.float64)
        self.texts = [alphabet.normalize(u.text) for u in kept]
        self.labels = [alphabet.encode(t) for t in self.texts]
        self.label_lengths = np.array([len(x) for x in self.labels], dtype=np.int64)
        self.expected_frames = np.array(
            [features.num_frames(round(d * audio.SAMPLE_RATE)) for d in self.durations], np.int64)
        self.check_usable()

    def __len__(self) -> int:
        return len(self.paths)

    def check_usable(self) -> None:
        """DataError if more than max_unusable_share of the entries is unusable, or none is."""
        if self.max_unusable_share is not None:
            self.problems.check_share(self.total, self.max_unusable_share, self.name)

    def _usable(self, u: Utterance, max_duration: float | None) -> bool:
        problem = self._metadata_problem(u, max_duration)
        if problem:
            self.problems.skip(problem[0], u.audio_filepath, problem[1])
        return problem is None

    def _metadata_problem(self, u: Utterance, max_duration: float | None) -> tuple[str, str] | None:
        text = alphabet.normalize(u.text)
        if not text:
            return P.EMPTY_TRANSCRIPT, f"transcript {u.text!r}"
        if lost := lost_characters(u.text):
            return P.UNKNOWN_CHARACTERS, f"{''.join(sorted(lost))!r} in {u.text!r}"
        if not os.path.isfile(u.audio_filepath):
            return P.MISSING_FILE, ""
        try:
            audio.duration(u.audio_filepath)  # the header only: files that are no audio at all
        except audio.AudioError as e:
            return P.UNREADABLE_AUDIO, str(e)
        if max_duration is not None and u.duration > max_duration:
            return P.TOO_LONG, f"{u.duration:.2f} s > {max_duration} s"
        frames = features.num_frames(round(u.duration * audio.SAMPLE_RATE))
        return self._labels_misfit(alphabet.encode(text), frames)

    def _labels_misfit(self, labels: np.ndarray, frames: int) -> tuple[str, str] | None:
        if self.output_frames is None:
            return None
        needed, available = ctc_min_frames(labels), self.output_frames(frames)
        if needed > available:
            return P.LABELS_TOO_LONG, f"CTC needs {needed} output frames, the model gives {available}"
        return None

    def _skip(self, reason: str, path: str, detail: str = "") -> None:
        self.problems.skip(reason, path, detail)
        self.check_usable()

    def load(self, index: int) -> Example | None:
        """Features and labels of utterance `index`, or None (counted) if its audio is bad."""
        path = self.paths[index]
        try:
            samples, resampled = audio.read_audio(path)
        except FileNotFoundError:
            return self._skip(P.MISSING_FILE, path)
        except audio.AudioError as e:
            return self._skip(P.UNREADABLE_AUDIO, path, str(e))
        if not np.isfinite(samples).all():  # would poison the features, the loss and the weights
            return self._skip(P.NON_FINITE_AUDIO, path, f"{np.count_nonzero(~np.isfinite(samples))} samples")
        if resampled:
            self.problems.note(P.RESAMPLED)
        spectrogram = features.featurize(samples, self.num_features)
        if problem := self._labels_misfit(self.labels[index], len(spectrogram)):
            return self._skip(problem[0], path, problem[1])
        return Example(spectrogram, self.labels[index], self.texts[index])
