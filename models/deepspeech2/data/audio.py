"""Reading audio files as 16 kHz mono float32, resampling with soxr where needed."""

import os

import numpy as np

SAMPLE_RATE = 16000


class AudioError(Exception):
    """The file cannot be decoded (corrupt, truncated, empty, not audio)."""


def resample(samples: np.ndarray, from_rate: int, to_rate: int = SAMPLE_RATE) -> np.ndarray:
    if from_rate == to_rate:
        return samples
    import soxr  # here, not at the top: the training step builds without it (scripts/gpu/gpu_check.sh's image)

    return soxr.resample(samples, from_rate, to_rate).astype(np.float32, copy=False)


def read_audio(path: str, sample_rate: int = SAMPLE_RATE) -> tuple[np.ndarray, bool]:
    """Mono float32 samples at `sample_rate` and whether they had to be resampled.

    Raises FileNotFoundError for a missing file and AudioError for files that cannot be decoded in full; a truncated file, whose
    header promises more frames than its body holds, counts as corrupt.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    import soundfile  # here, not at the top: see resample

    try:
        with soundfile.SoundFile(path) as f:
            expected, rate = f.frames, f.samplerate
            samples = f.read(dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, EOFError, ValueError) as e:
        raise AudioError(str(e)) from None
    if len(samples) == 0:
        raise AudioError("no samples")
    if len(samples) != expected:
        raise AudioError(f"truncated: header says {expected} frames, read {len(samples)}")
    mono = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    return resample(mono, rate, sample_rate), rate != sample_rate


def duration(path: str) -> float:
    """Seconds of audio according to the file's header (raises AudioError if unreadable)."""
    import soundfile  # here, not at the top: see resample

    try:
        info = soundfile.info(path)
    except (soundfile.LibsndfileError, RuntimeError, EOFError, ValueError) as e:
        raise AudioError(str(e)) from None
    return info.frames / info.samplerate
