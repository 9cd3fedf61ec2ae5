"""Deep Speech 2 input features: 161-bin log spectrogram, 20 ms Hamming window, 10 ms stride.

At 16 kHz the window is 320 samples and the FFT 320 points, so rfft gives 161 bins. Each
utterance is normalised on its own (per frequency bin, over time), which removes channel
gain and colour without corpus statistics.
"""

import numpy as np

WINDOW = 320  # 20 ms at 16 kHz
STRIDE = 160  # 10 ms
NUM_BINS = WINDOW // 2 + 1  # 161
_HAMMING = np.hamming(WINDOW).astype(np.float32)


def num_frames(num_samples: int) -> int:
    """Frames of `num_samples` samples: whole windows, and at least one (short audio is padded)."""
    return 1 + max(0, num_samples - WINDOW) // STRIDE


def log_spectrogram(samples: np.ndarray) -> np.ndarray:
    """[frames, 161] float32 log(1 + |STFT|) of 16 kHz mono samples."""
    samples = np.asarray(samples, dtype=np.float32)
    if len(samples) < WINDOW:
        samples = np.pad(samples, (0, WINDOW - len(samples)))
    frames = np.lib.stride_tricks.sliding_window_view(samples, WINDOW)[::STRIDE]
    return np.log1p(np.abs(np.fft.rfft(frames * _HAMMING, axis=1))).astype(np.float32)


def normalize(spectrogram: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Zero mean, unit variance per frequency bin over the utterance's frames."""
    mean = spectrogram.mean(axis=0, keepdims=True)
    std = spectrogram.std(axis=0, keepdims=True)
    return (spectrogram - mean) / (std + eps)


def featurize(samples: np.ndarray) -> np.ndarray:
    """The model's input for one utterance: normalised log spectrogram, [frames, 161] float32."""
    return normalize(log_spectrogram(samples))
