"""SVOX Pico text-to-speech (Android's former synthesizer), from PyPI's `ttspico`.

Pico's voices are hidden-Markov-model synthesis trained on recordings of real speakers:
en-US (lh0, a US female speaker) and en-GB (kh0, a British female speaker), each with its own
text analysis. ttspico compiles the engine from source with its voice files, so the
speech extra of pyproject.toml installs it; nothing is downloaded at synthesis time. Without it,
`available()` is False and synthesis raises SynthesizerMissing.

An engine's unvoiced excitation reads on through a table of random phases from one utterance
to the next, so its speech depends on what it spoke before: `reset()` starts fresh engines
(as espeak.reset does for eSpeak), and the same sequence of calls after it gives the same audio.
(A fresh engine per utterance would do too, but ttspico leaks about 16 KB per engine.)
"""

from __future__ import annotations

import functools

import numpy as np

from models.deepspeech2.data.synthesizers import SynthesizerMissing

VOICES = ("en-US", "en-GB")
SAMPLE_RATE = 16000  # Pico's only output rate
RATE_PERCENT = (20, 500)  # Pico's limits on its speed and pitch levels (100: the voice's own)
PITCH_PERCENT = (50, 200)
INSTALL = "install PyPI's ttspico (pip install ttspico; the speech extra of pyproject.toml, which `make train` installs)"


@functools.cache
def _engine(voice: str):
    if voice not in VOICES:
        raise ValueError(f"pico has no voice {voice!r}; voices: {', '.join(VOICES)}")
    try:
        import ttspico
    except ImportError as error:
        raise SynthesizerMissing(f"pico: {error}; {INSTALL}") from None
    return ttspico.TtsEngine(voice)


def reset() -> None:
    """Drops the engines, so that the next synthesis starts from a fresh engine's state."""
    _engine.cache_clear()


def available() -> bool:
    """Whether ttspico and all of VOICES can be loaded."""
    try:
        for voice in VOICES:
            _engine(voice)
    except (SynthesizerMissing, RuntimeError):
        return False
    return True


def synthesize(text: str, voice: str, rate_percent: int = 100, pitch_percent: int = 100) -> tuple[np.ndarray, int]:
    """Speech for `text` as float32 samples in [-1, 1) and its sample rate.

    rate_percent: speaking rate, 100 the voice's own, above it faster. pitch_percent: the voice's f0 scaled.
    """
    for name, value, (low, high) in (("rate", rate_percent, RATE_PERCENT), ("pitch", pitch_percent, PITCH_PERCENT)):
        if not low <= value <= high:
            raise ValueError(f"pico {name} {value}% is outside Pico's {low}-{high}%")
    engine = _engine(voice)
    # Settings persist in the engine: set every time.
    engine.rate, engine.pitch = int(rate_percent), int(pitch_percent)
    pcm = engine.speak(text)
    if not pcm:
        raise RuntimeError(f"pico voice {voice} produced no audio for {text!r}")
    return np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0, SAMPLE_RATE
