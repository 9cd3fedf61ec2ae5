"""Speed, rooms and noise (models/deepspeech2/data/acoustics.py) against float64 numpy measurements."""

import numpy as np
import pytest
import scipy.signal

from models.deepspeech2.data import acoustics

RATE = acoustics.SAMPLE_RATE


@pytest.mark.parametrize("factor", [0.88, 0.93, 1.07, 1.12])
def test_a_speed_change_shortens_and_raises_every_frequency_by_its_factor(factor):
    rng = np.random.default_rng(int(factor * 100))
    frequency = rng.uniform(300, 900)
    n = 16001  # an odd length
    sine = np.sin(2 * np.pi * frequency * np.arange(n) / RATE).astype(np.float32)
    faster = acoustics.change_speed(sine, factor)
    assert abs(len(faster) - n / factor) <= 2
    spectrum = np.abs(np.fft.rfft(faster.astype(np.float64) * np.hanning(len(faster))))
    peak = np.argmax(spectrum) * RATE / len(faster)
    assert peak == pytest.approx(frequency * factor, abs=2.0)
    assert acoustics.change_speed(sine, 1.0) is sine
    with pytest.raises(ValueError, match="positive"):
        acoustics.change_speed(sine, 0.0)


def schroeder_rt60(response: np.ndarray) -> float:
    """RT60 from the energy decay curve (backward integral of the squared response), fitted from -5 to -25 dB."""
    decay = np.cumsum(response[::-1].astype(np.float64) ** 2)[::-1]
    level = 10 * np.log10(decay / decay[0])
    t = np.arange(len(response)) / RATE
    fit = (level <= -5) & (level >= -25)
    slope = np.polyfit(t[fit], level[fit], 1)[0]  # dB per second
    return -60 / slope


@pytest.mark.parametrize("rt60, ratio_db", [(0.2, 3.0), (0.45, 0.0), (0.7, 9.5)])
def test_a_rooms_response_decays_at_its_rt60_with_its_direct_to_reverb_ratio(rt60, ratio_db):
    response = acoustics.room_impulse_response(np.random.default_rng(3), rt60, ratio_db)
    assert np.sum(response.astype(np.float64) ** 2) == pytest.approx(1.0)
    direct, tail = response[0] ** 2, np.sum(response[1:].astype(np.float64) ** 2)
    assert 10 * np.log10(direct / tail) == pytest.approx(ratio_db, abs=1e-6)
    assert schroeder_rt60(response[1:]) == pytest.approx(rt60, rel=0.1)


def test_reverberation_is_the_convolution_cut_to_the_input():
    rng = np.random.default_rng(5)
    samples = rng.standard_normal(3001).astype(np.float32)
    response = acoustics.room_impulse_response(rng, 0.1, 6.0)
    reference = np.convolve(samples.astype(np.float64), response)[: len(samples)]
    np.testing.assert_allclose(acoustics.reverberate(samples, response), reference, atol=1e-4)


@pytest.mark.parametrize("colour", list(acoustics.NOISE_COLOURS))
@pytest.mark.parametrize("snr_db", [10.0, 27.5])
def test_noise_is_added_at_the_snr_with_its_colours_slope(colour, snr_db):
    rng = np.random.default_rng(11)
    speech = (rng.standard_normal(48011) * 0.1).astype(np.float32)
    noisy = acoustics.add_noise(np.random.default_rng(2), speech, snr_db, colour)
    added = noisy.astype(np.float64) - speech
    measured = 10 * np.log10(np.mean(speech.astype(np.float64) ** 2) / np.mean(added**2))
    assert measured == pytest.approx(snr_db, abs=0.01)
    # power spectral density falls as 1 / f^exponent: the slope of log power over log frequency
    frequencies, power = scipy.signal.welch(added, RATE, nperseg=2048)
    band = (frequencies > 50) & (frequencies < 4000)
    slope = np.polyfit(np.log10(frequencies[band]), np.log10(power[band]), 1)[0]
    assert slope == pytest.approx(-acoustics.NOISE_COLOURS[colour], abs=0.15)
