"""Deep Speech 2 input features: log spectrogram, 20 ms Hamming window, 10 ms stride.

At 16 kHz the window is 320 samples and the FFT 320 points, so rfft gives 161 bins: the
paper's features. Fewer features are that many mel bands over the same bins (triangles on
the mel scale, 0-8 kHz), which keep the spectral envelope and blur the harmonics of the
voice's pitch above a few hundred Hz. Each utterance is normalised on its own (per feature,
over time), which removes channel gain and colour without corpus statistics.
"""

import functools

import numpy as np

from models.deepspeech2.data.audio import SAMPLE_RATE

WINDOW = 320  # 20 ms at 16 kHz
STRIDE = 160  # 10 ms
NUM_BINS = WINDOW // 2 + 1  # 161
_HAMMING = np.hamming(WINDOW).astype(np.float32)


def num_frames(num_samples: int) -> int:
    """Frames of `num_samples` samples: whole windows, and at least one (short audio is padded)."""
    return 1 + max(0, num_samples - WINDOW) // STRIDE


def magnitudes(samples: np.ndarray) -> np.ndarray:
    """[frames, 161] float32 |STFT| of 16 kHz mono samples."""
    samples = np.asarray(samples, dtype=np.float32)
    if len(samples) < WINDOW:
        samples = np.pad(samples, (0, WINDOW - len(samples)))
    frames = np.lib.stride_tricks.sliding_window_view(samples, WINDOW)[::STRIDE]
    return np.abs(np.fft.rfft(frames * _HAMMING, axis=1)).astype(np.float32)


def log_spectrogram(samples: np.ndarray) -> np.ndarray:
    """[frames, 161] float32 log(1 + |STFT|) of 16 kHz mono samples."""
    return np.log1p(magnitudes(samples))


def mel(hz):
    """The mel scale (O'Shaughnessy's formula, as HTK's)."""
    return 2595.0 * np.log10(1.0 + np.asarray(hz, np.float64) / 700.0)


@functools.cache
def mel_filterbank(bands: int) -> np.ndarray:
    """[161, bands] float32 weights: band b is a triangle from mel edge b to b + 2, peaking at b + 1,
    the bands + 2 edges equally spaced on the mel scale from 0 Hz to the Nyquist frequency."""
    if not 1 <= bands < NUM_BINS:
        raise ValueError(f"mel bands must be 1 to {NUM_BINS - 1} (161 is the linear spectrogram); got {bands}")
    edges = np.linspace(0.0, float(mel(SAMPLE_RATE / 2)), bands + 2)
    bins = mel(np.arange(NUM_BINS) * SAMPLE_RATE / WINDOW)[:, None]
    rising = (bins - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[None, 2:] - bins) / (edges[2:] - edges[1:-1])
    return np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)


def log_features(samples: np.ndarray, num_features: int = NUM_BINS) -> np.ndarray:
    """[frames, num_features] float32: the log spectrogram (161) or log(1 + mel-band magnitude) (fewer)."""
    if num_features == NUM_BINS:
        return log_spectrogram(samples)
    return np.log1p(magnitudes(samples) @ mel_filterbank(num_features))


def normalize(spectrogram: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Zero mean, unit variance per frequency bin over the utterance's frames."""
    mean = spectrogram.mean(axis=0, keepdims=True)
    std = spectrogram.std(axis=0, keepdims=True)
    return (spectrogram - mean) / (std + eps)


def featurize(samples: np.ndarray, num_features: int = NUM_BINS) -> np.ndarray:
    """The model's input for one utterance: normalised log features, [frames, num_features] float32."""
    return normalize(log_features(samples, num_features))
