import numpy as np
import pytest

from models.deepspeech2.data import features


def reference_log_spectrogram(samples):
    """float64, one frame at a time, DFT by matrix product."""
    window, stride = 320, 160
    n = np.arange(window)
    hamming = 0.54 - 0.46 * np.cos(2 * np.pi * n / (window - 1))
    dft = np.exp(-2j * np.pi * np.outer(np.arange(161), n) / window)
    starts = range(0, len(samples) - window + 1, stride)
    return np.array([np.log1p(np.abs(dft @ (samples[s:s + window] * hamming))) for s in starts])


@pytest.mark.parametrize("length", [320, 321, 479, 480, 4000, 5555])
def test_log_spectrogram_matches_float64_reference(length):
    samples = np.random.default_rng(length).uniform(-1, 1, length)
    got = features.log_spectrogram(samples.astype(np.float32))
    want = reference_log_spectrogram(samples)
    assert got.shape == want.shape == (features.num_frames(length), 161)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_frames_are_20ms_windows_every_10ms():
    assert features.num_frames(16000) == 99  # 1 + (16000 - 320) // 160
    assert features.num_frames(0) == features.num_frames(100) == 1
    assert features.log_spectrogram(np.zeros(100, np.float32)).shape == (1, 161)


def test_tone_peaks_in_its_bin():
    rate, freq = 16000, 1000.0  # bins are 50 Hz apart: bin 20
    t = np.arange(rate) / rate
    spectrogram = features.log_spectrogram(np.sin(2 * np.pi * freq * t).astype(np.float32))
    assert set(spectrogram.argmax(axis=1)) == {20}


def test_normalize_per_bin():
    spectrogram = np.random.default_rng(1).gamma(2.0, 3.0, (77, 161)).astype(np.float32)
    normal = features.normalize(spectrogram)
    np.testing.assert_allclose(normal.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(normal.std(axis=0), 1, atol=1e-3)


def test_featurize_ignores_gain():
    samples = np.random.default_rng(2).standard_normal(8000).astype(np.float32)
    # log1p is not scale-free near zero, so compare at amplitudes where log(1+x) ~ log x.
    np.testing.assert_allclose(features.featurize(100 * samples), features.featurize(1000 * samples),
                               atol=0.05)


def reference_mel_weight(bin_hz, band, bands):
    """Float64, one (bin, band) at a time: the triangle over mel edges band, band + 1, band + 2."""
    to_mel = lambda hz: 2595.0 * np.log10(1.0 + hz / 700.0)  # noqa: E731
    top = to_mel(8000.0)
    lo, mid, hi = (top * (band + k) / (bands + 1) for k in range(3))
    m = to_mel(bin_hz)
    if lo < m <= mid:
        return (m - lo) / (mid - lo)
    if mid < m < hi:
        return (hi - m) / (hi - mid)
    return 0.0


@pytest.mark.parametrize("bands", [1, 13, 40, 64, 160])
def test_mel_filterbank_matches_float64_reference(bands):
    want = np.array([[reference_mel_weight(50.0 * b, band, bands) for band in range(bands)] for b in range(161)])
    got = features.mel_filterbank(bands)
    assert got.shape == (161, bands) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("bands", [0, -3, 161, 200])
def test_mel_bands_outside_the_spectrogram_are_refused(bands):
    with pytest.raises(ValueError, match="mel bands must be 1 to 160"):
        features.mel_filterbank(bands)


@pytest.mark.parametrize("length", [320, 3333, 8000])
def test_log_mel_features_match_float64_reference(length):
    samples = np.random.default_rng(length + 7).uniform(-1, 1, length)
    magnitude = np.expm1(reference_log_spectrogram(samples))
    weights = np.array([[reference_mel_weight(50.0 * b, band, 40) for band in range(40)] for b in range(161)])
    got = features.log_features(samples.astype(np.float32), 40)
    assert got.shape == (features.num_frames(length), 40)
    np.testing.assert_allclose(got, np.log1p(magnitude @ weights), rtol=1e-4, atol=1e-4)


def test_tone_peaks_in_the_mel_band_around_it():
    t = np.arange(16000) / 16000
    bank = features.mel_filterbank(40)
    for freq in (300.0, 1000.0, 3150.0):
        raw = features.log_features(np.sin(2 * np.pi * freq * t).astype(np.float32), 40)
        assert raw.shape == (99, 40)
        assert set(raw.argmax(axis=1)) == {int(bank[round(freq / 50)].argmax())}
