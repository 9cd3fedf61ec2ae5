"""Flite, Festival, Pico and the corpus of several synthesizers (models/deepspeech2/data/voices.py).

Flite and Festival come from Debian packages (`make train-voices` installs them); without
them the tests that need them are skipped, saying what to install. Pico (PyPI's ttspico)
is in the speech extra that `make test` installs, so its tests always run.
"""

import collections
import json
import subprocess

import numpy as np
import pytest
import soundfile

from models.deepspeech2.data import festival, flite, pico, synth, voices
from models.deepspeech2.data.synthesizers import SynthesizerMissing
from models.deepspeech2.task import DataConfig

needs_flite = pytest.mark.skipif(not flite.available(), reason=f"flite is not installed: {flite.INSTALL}")
needs_festival = pytest.mark.skipif(not festival.available(), reason=f"festival is not installed: {festival.INSTALL}")
needs_all = pytest.mark.skipif(bool(voices.missing()), reason=f"synthesizers missing: {voices.INSTALL}")
TEXT = "seven of clubs and five five please"


@needs_flite
@pytest.mark.parametrize("voice", flite.VOICES)
def test_flite_through_ctypes_equals_the_flite_command(voice, tmp_path):
    slower, _ = flite.synthesize(TEXT, voice, duration_stretch=1.3)  # settings must not leak into the next call
    samples, rate = flite.synthesize(TEXT, voice)
    subprocess.run(["flite", "-voice", voice, "-t", TEXT, "-o", str(tmp_path / "ref.wav")], check=True)
    reference, reference_rate = soundfile.read(tmp_path / "ref.wav", dtype="int16")
    assert rate == reference_rate == 16000
    np.testing.assert_array_equal(np.round(samples * 32768).astype(np.int16), reference)
    assert len(slower) / len(samples) == pytest.approx(1.3, abs=0.05)


def _median_f0(samples: np.ndarray, rate: int = 16000) -> float:
    """Median over loud frames of the autocorrelation's strongest lag in 60-400 Hz, float64 numpy."""
    samples = samples.astype(np.float64)
    estimates = []
    for start in range(0, len(samples) - 640, 320):
        frame = samples[start:start + 640] - samples[start:start + 640].mean()
        if np.sum(frame**2) < 0.05 * len(frame) * np.mean(samples**2):
            continue
        correlation = np.correlate(frame, frame, "full")[len(frame) - 1:]
        lag = rate // 400 + np.argmax(correlation[rate // 400: rate // 60])
        estimates.append(rate / lag)
    return float(np.median(estimates))


@needs_flite
def test_flite_diphone_voice_speaks_at_the_pitch_asked_and_then_at_its_own():
    own, _ = flite.synthesize(TEXT, "kal16")
    high, _ = flite.synthesize(TEXT, "kal16", pitch_hz=(200.0, 30.0))
    again, _ = flite.synthesize(TEXT, "kal16")  # the setting must not leak into the next call
    assert _median_f0(own) == pytest.approx(95, rel=0.15)
    assert _median_f0(high) == pytest.approx(200, rel=0.1)
    np.testing.assert_array_equal(again, own)
    with pytest.raises(ValueError, match="flite voice slt has no pitch setting"):
        flite.synthesize(TEXT, "slt", pitch_hz=(200.0, 30.0))


@needs_flite
def test_flite_refuses_a_voice_it_does_not_have():
    with pytest.raises(ValueError, match="flite has no voice 'kal_diphone'"):
        flite.synthesize(TEXT, "kal_diphone")


@pytest.mark.parametrize("voice", pico.VOICES)
def test_pico_speaks_at_the_rate_and_pitch_asked_and_then_as_itself(voice):
    pico.reset()
    own, rate = pico.synthesize(TEXT, voice)
    faster, _ = pico.synthesize(TEXT, voice, rate_percent=150)
    lower, _ = pico.synthesize(TEXT, voice, pitch_percent=60)
    again, _ = pico.synthesize(TEXT, voice)  # settings must not leak into the next call
    assert rate == 16000 and own.dtype == np.float32 and 0.05 < np.max(np.abs(own)) <= 1.0
    assert 1.5 < len(own) / rate < 4.0  # seven words
    assert len(again) == len(own) and _median_f0(again) == pytest.approx(_median_f0(own), rel=0.05)
    pico.reset()  # the same calls from fresh engines: the same audio
    np.testing.assert_array_equal(pico.synthesize(TEXT, voice)[0], own)
    np.testing.assert_array_equal(pico.synthesize(TEXT, voice, rate_percent=150)[0], faster)
    assert len(own) / len(faster) == pytest.approx(1.5, rel=0.1)
    assert _median_f0(lower) / _median_f0(own) == pytest.approx(0.6, rel=0.12)


def test_pico_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="pico has no voice 'en-AU'"):
        pico.synthesize(TEXT, "en-AU")
    with pytest.raises(ValueError, match="pico rate 600% is outside Pico's 20-500%"):
        pico.synthesize(TEXT, "en-US", rate_percent=600)
    with pytest.raises(ValueError, match="pico pitch 40% is outside Pico's 50-200%"):
        pico.synthesize(TEXT, "en-US", pitch_percent=40)


@needs_festival
def test_festival_in_one_batch_equals_text2wave_per_utterance(tmp_path):
    requests = [(TEXT, "ked_diphone", 1.0), ('a "quoted" word', "kal_diphone", 1.0), (TEXT, "ked_diphone", 1.4)]
    outputs = festival.synthesize_many(requests)
    (tmp_path / "t.txt").write_text(TEXT)
    subprocess.run(["text2wave", "-eval", "(voice_ked_diphone)", str(tmp_path / "t.txt"), "-o", str(tmp_path / "ref.wav")],
                   check=True, capture_output=True)
    reference, reference_rate = soundfile.read(tmp_path / "ref.wav", dtype="float32")
    samples, rate = outputs[0]
    assert rate == reference_rate == 16000
    np.testing.assert_allclose(samples, reference, atol=1 / 32768)
    assert len(outputs[1][0]) > 0.3 * rate
    assert len(outputs[2][0]) / len(samples) == pytest.approx(1.4, abs=0.1)
    with pytest.raises(ValueError, match="festival has no voice 'awb'"):
        festival.synthesize_many([(TEXT, "awb", 1.0)])


@needs_festival
def test_festival_speaks_at_the_pitch_asked_for_that_utterance_only():
    high, own, low = festival.synthesize_many([(TEXT, "kal_diphone", 1.0, (200.0, 30.0)), (TEXT, "kal_diphone", 1.0, None),
                                               (TEXT, "ked_diphone", 1.0, (85.0, 10.0))])
    assert _median_f0(high[0]) == pytest.approx(200, rel=0.1)
    assert _median_f0(own[0]) == pytest.approx(105, rel=0.1)
    assert _median_f0(low[0]) == pytest.approx(85, rel=0.1)
    np.testing.assert_array_equal(own[0], festival.synthesize_many([(TEXT, "kal_diphone", 1.0)])[0][0])


def test_dev_and_test_never_share_a_synthesizer_or_a_speaker_with_training():
    sizes = voices.split_sizes(3000)
    assert sizes == {"train": 2100, "dev": 300, "test": 300, "test_espeak": 300}
    plans = collections.defaultdict(list)
    for index in range(0, 3000, 3):
        split = synth.split_of(index, sizes)
        plans[split].append(voices.plan(4, index, split))
    assert voices.plan(4, 33, "train") == voices.plan(4, 33, "train")  # a function of (seed, index)
    train_synths = collections.Counter(p["synthesizer"] for p in plans["train"])
    assert set(train_synths) == set(voices.TRAIN_SHARES)
    for synthesizer, share in voices.TRAIN_SHARES.items():
        assert train_synths[synthesizer] / len(plans["train"]) == pytest.approx(share, abs=0.06)
    train_flite = {p["voice"] for p in plans["train"] if p["synthesizer"] == "flite"}
    assert train_flite == set(flite.DIPHONE_VOICES)
    for split in ("dev", "test"):
        assert {p["synthesizer"] for p in plans[split]} == {"flite"}
        assert {p["voice"] for p in plans[split]} == set(voices.FLITE_VOICES[split])
        assert not train_flite & set(voices.FLITE_VOICES[split])
        assert not any("pitch_hz" in p for p in plans[split])
    diphone = [p for p in plans["train"] if p["synthesizer"] in ("festival", "flite")]
    pitch = np.array([p["pitch_hz"][0] for p in diphone])
    assert voices.PITCH_HZ[0] <= pitch.min() and pitch.max() <= voices.PITCH_HZ[1] and np.ptp(pitch) > 100
    speed = np.array([p["speed"] for p in diphone])
    assert voices.VOCAL_TRACT_SPEED[0] - 1e-3 <= speed.min() and speed.max() <= voices.VOCAL_TRACT_SPEED[1] + 1e-3
    picos = [p for p in plans["train"] if p["synthesizer"] == "pico"]
    assert {p["voice"] for p in picos} == set(pico.VOICES)
    pitch = np.array([p["pitch_percent"] for p in picos])
    assert voices.PICO_PITCH_PERCENT[0] <= pitch.min() and pitch.max() <= voices.PICO_PITCH_PERCENT[1] and np.ptp(pitch) > 50
    speed = np.array([p["speed"] for p in picos])
    assert voices.PICO_VOCAL_TRACT_SPEED[0] - 1e-3 <= speed.min() and speed.max() <= voices.PICO_VOCAL_TRACT_SPEED[1] + 1e-3
    # The tempo heard (stretch / speed) stays in the range of the held-out splits'.
    stretch = np.array([p["duration_stretch"] for p in diphone] + [100 / p["rate_percent"] for p in picos])
    tempo = stretch / np.array([p["speed"] for p in diphone + picos])
    low, high = voices.DURATION_STRETCH[0] / voices.SPEED[1], voices.DURATION_STRETCH[1] / voices.SPEED[0]
    assert low - 0.01 <= tempo.min() and tempo.max() <= high + 0.01
    assert {p["synthesizer"] for p in plans["test_espeak"]} == {"espeak"}
    train_variants = {p["voice"].split("+")[1] for p in plans["train"] if p["synthesizer"] == "espeak"}
    test_variants = {p["voice"].split("+")[1] for p in plans["test_espeak"]}
    assert train_variants <= set(synth.VARIANTS["train"]) and test_variants <= set(synth.VARIANTS["test"])
    everything = [p for split in plans.values() for p in split]
    assert {p["snr_db"] for p in everything} == set(voices.SNR_DB)
    assert 0.4 < np.mean(["rt60_s" in p for p in everything]) < 0.6
    with pytest.raises(ValueError, match="at least 4 utterances"):
        voices.split_sizes(3)


@needs_all
def test_a_tiny_voices_corpus(tmp_path):
    folder = voices.ensure_voices_corpus(str(tmp_path), 12, seed=3)
    rows = {s: [json.loads(line) for line in open(f"{folder}/{s}.jsonl")] for s in voices.SPLITS}
    assert {s: len(r) for s, r in rows.items()} == voices.split_sizes(12)
    for split, entries in rows.items():
        for entry in entries:
            samples, rate = soundfile.read(f"{folder}/{entry['audio_filepath']}", dtype="float32")
            assert rate == 16000 and len(samples) / rate == pytest.approx(entry["duration"])
            assert 0.3 <= np.abs(samples).max() <= 0.9 + 1e-4
            assert entry == {**voices.plan(3, int(entry["audio_filepath"][-12:-5]), split), **entry}
    assert DataConfig(corpus="voices").describe().endswith("(flite rms, slt)")


def test_a_missing_synthesizer_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(festival, "missing", lambda: ["festival", "ked_diphone"])
    with pytest.raises(SynthesizerMissing, match="needs festival, ked_diphone.*apt-get install flite festival"):
        voices.generate_corpus(str(tmp_path), 8, seed=0)
