"""What a recording does to speech, simulated on 16 kHz samples: speed, rooms, noise.

Used when a corpus is synthesised (models/deepspeech2/data/voices.py), so every epoch sees
the same audio and the cost is paid once:

- speed perturbation: resampling by a factor, which changes tempo, pitch and formants
  together, as a different speaker talking faster or slower does (Ko et al. 2015, the
  Kaldi recipe's 0.9 / 1.0 / 1.1);
- reverberation: the impulse response of a room as exponentially decaying noise after a
  direct path, with the decay of a reverberation time RT60 (the level falls by 60 dB in
  RT60 seconds), the standard statistical model of late reverberation;
- additive noise of a colour (white, pink 1/f, brown 1/f^2) at a signal-to-noise ratio.
"""

from __future__ import annotations

import numpy as np
import scipy.fft
import scipy.signal

SAMPLE_RATE = 16000
NOISE_COLOURS = {"white": 0.0, "pink": 1.0, "brown": 2.0}  # power falls as 1 / f^exponent


def change_speed(samples: np.ndarray, factor: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """`samples` played `factor` times faster (factor 1.1: 10% shorter, every frequency 10% higher)."""
    if factor <= 0:
        raise ValueError(f"a speed factor must be positive; got {factor}")
    if factor == 1:
        return samples
    import soxr  # here, not at the top: the training step builds without it (scripts/gpu/gpu_check.sh's image)

    # Read as if recorded at rate * factor and resampled to rate: len / factor samples.
    return soxr.resample(samples, rate * factor, rate).astype(np.float32, copy=False)


def room_impulse_response(rng: np.random.Generator, rt60_s: float, direct_to_reverb_db: float,
                          rate: int = SAMPLE_RATE) -> np.ndarray:
    """A unit-energy impulse response: a direct path, then noise decaying by 60 dB per `rt60_s`.

    direct_to_reverb_db: energy of the direct path over that of the tail (a near microphone
    is high, a far one low). The tail lasts 1.2 RT60 and starts after 2.5 ms (early reflections).
    """
    if rt60_s <= 0:
        raise ValueError(f"rt60_s must be positive; got {rt60_s}")
    delay = int(0.0025 * rate)
    t = np.arange(int(1.2 * rt60_s * rate)) / rate
    tail = rng.standard_normal(len(t)) * 10 ** (-3 * t / rt60_s)  # amplitude -60 dB at t = rt60 (energy too)
    tail *= np.sqrt(10 ** (-direct_to_reverb_db / 10) / np.sum(tail**2))
    response = np.concatenate([[1.0], np.zeros(delay - 1), tail])
    return response / np.sqrt(np.sum(response**2))


def reverberate(samples: np.ndarray, response: np.ndarray) -> np.ndarray:
    """`samples` heard through `response`, cut to their own length (the decay past the end is dropped)."""
    return scipy.signal.fftconvolve(samples, response)[: len(samples)].astype(np.float32)


def noise(rng: np.random.Generator, n: int, colour: str) -> np.ndarray:
    """n samples of `colour` noise (NOISE_COLOURS) with unit RMS."""
    exponent = NOISE_COLOURS[colour]
    # Shaped at a length the FFT handles fast, then cut: n itself may be a large prime.
    white = rng.standard_normal(scipy.fft.next_fast_len(n, real=True))
    spectrum = scipy.fft.rfft(white)
    spectrum[1:] /= np.arange(1, len(spectrum)) ** (exponent / 2)  # amplitude: the square root of power
    spectrum[0] = 0
    shaped = scipy.fft.irfft(spectrum, len(white))[:n]
    return shaped / (np.sqrt(np.mean(shaped**2)) + 1e-12)


def add_noise(rng: np.random.Generator, samples: np.ndarray, snr_db: float, colour: str) -> np.ndarray:
    """`samples` plus `colour` noise whose power is the samples' power / 10^(snr_db / 10)."""
    signal_rms = np.sqrt(np.mean(np.square(samples, dtype=np.float64)))
    added = noise(rng, len(samples), colour) * signal_rms * 10 ** (-snr_db / 20)
    return (samples + added).astype(np.float32)
