"""The eSpeak synthetic corpus."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile

from models.deepspeech2 import alphabet
from models.deepspeech2.data import espeak, manifest, synth, vocabulary
from models.deepspeech2.data.dataset import SpeechDataset

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


def test_espeak_speaks():
    samples, rate = espeak.synthesize("seven", "en-us")
    assert rate == 22050
    assert samples.dtype == np.float32 and 0.2 < len(samples) / rate < 2.0
    assert 0.05 < np.abs(samples).max() <= 1.0
    longer, _ = espeak.synthesize("seven eight nine ten", "en-us")
    assert len(longer) > 2 * len(samples)


def fresh_synthesis(*args, **kwargs):
    espeak.reset()
    return espeak.synthesize(*args, **kwargs)[0]


def test_espeak_voices_and_settings_change_the_audio():
    base = fresh_synthesis("hello", "en-us+m1")
    assert not np.array_equal(base, fresh_synthesis("hello", "en-gb-x-rp+f3"))
    assert len(fresh_synthesis("hello", "en-us+m1", rate=100)) > 1.3 * len(base)
    assert not np.array_equal(base, fresh_synthesis("hello", "en-us+m1", pitch=90))


def test_espeak_reset_makes_output_reproducible():
    # sandro breathes: its noise generator is seeded from the clock unless we seed it.
    first = fresh_synthesis("hello there", "en-us+sandro")
    espeak.synthesize("something else first", "en-gb-x-rp+f3")
    time.sleep(1.1)
    np.testing.assert_array_equal(first, fresh_synthesis("hello there", "en-us+sandro"))


def test_espeak_unknown_voice():
    with pytest.raises(espeak.EspeakError, match="no voice 'xx-nowhere'"):
        espeak.synthesize("hello", "xx-nowhere")


def test_every_configured_voice_exists():
    for accent in synth.ACCENTS:
        for variant in sum(synth.VARIANTS.values(), ()):
            espeak.engine().synthesize("a", f"{accent}+{variant}", 175, 50, 50)


def test_held_out_voices_are_disjoint():
    train, dev, test = (set(synth.VARIANTS[s]) for s in synth.SPLITS)
    assert not (train & dev or train & test or dev & test)


def test_vocabulary_is_in_the_alphabet():
    rng = np.random.default_rng(0)
    texts = [vocabulary.sample_text(rng) for _ in range(200)]
    assert all(alphabet.normalize(t) == t and 2 <= len(t.split()) <= 5 for t in texts)
    assert set("".join(vocabulary.WORDS + vocabulary.PHRASES)) == set(alphabet.SYMBOLS[1:])


def test_split_sizes():
    assert synth.split_sizes(1000) == {"train": 800, "dev": 100, "test": 100}
    assert synth.split_sizes(3) == {"train": 1, "dev": 1, "test": 1}
    with pytest.raises(ValueError, match="at least 3"):
        synth.split_sizes(2)


def test_noise_is_unit_rms_white_or_pink():
    rng = np.random.default_rng(3)
    spectra = []
    for _ in range(8):
        x = synth.noise(rng, 9973)  # prime length
        assert len(x) == 9973 and np.sqrt(np.mean(x**2)) == pytest.approx(1.0)
        power = np.abs(np.fft.rfft(x)) ** 2
        spectra.append(power[50:500].mean() / power[3000:4500].mean())
    # white: low/high band power ~1; pink: ~(3750/275) ~ 14
    assert min(spectra) < 2 and max(spectra) > 5


def test_utterances_are_short_clear_and_noisy():
    for index in range(12):
        samples, fields = synth.make_utterance(0, index, "train")
        assert 0.6 < fields["duration"] < 3.0
        assert len(samples) == round(fields["duration"] * 16000)
        assert 0.3 <= np.abs(samples).max() <= 0.9 + 1e-6
        assert synth.SNR_DB[0] <= fields["snr_db"] <= synth.SNR_DB[1]
        assert fields["voice"].split("+")[1] in synth.VARIANTS["train"]


def test_corpus_files_and_manifests(tiny_corpus):
    voices = {}
    for split, size in synth.split_sizes(24).items():
        utterances = manifest.read_manifest(str(tiny_corpus / f"{split}.jsonl"))
        assert len(utterances) == size
        rows = (tiny_corpus / f"{split}.jsonl").read_text().splitlines()
        voices[split] = {json.loads(r)["voice"].split("+")[1] for r in rows}
        assert voices[split] <= set(synth.VARIANTS[split])
        for u in utterances:
            info = soundfile.info(u.audio_filepath)
            assert info.samplerate == 16000 and info.format == "FLAC"
            assert info.frames / 16000 == pytest.approx(u.duration, abs=1e-4)
            assert alphabet.normalize(u.text) == u.text
    assert not voices["train"] & (voices["dev"] | voices["test"])


def test_corpus_is_a_function_of_seed(tmp_path, tiny_corpus):
    synth.generate_corpus(str(tmp_path / "again"), 24, seed=7)
    synth.generate_corpus(str(tmp_path / "other"), 24, seed=8)
    for split in synth.SPLITS:
        assert (tmp_path / "again" / f"{split}.jsonl").read_text() == \
            (tiny_corpus / f"{split}.jsonl").read_text()
    first = sorted((tiny_corpus / "audio" / "train").iterdir())[0].name
    same = [soundfile.read(str(d / "audio" / "train" / first))[0] for d in (tiny_corpus, tmp_path / "again")]
    np.testing.assert_array_equal(*same)
    assert (tmp_path / "other" / "train.jsonl").read_text() != (tiny_corpus / "train.jsonl").read_text()


def test_process_pool_makes_the_same_corpus(tmp_path):
    n = synth.BLOCK + 5  # two blocks over two workers
    synth.generate_corpus(str(tmp_path / "one"), n, seed=5, workers=1)
    synth.generate_corpus(str(tmp_path / "pool"), n, seed=5, workers=2)
    for split in synth.SPLITS:
        assert (tmp_path / "one" / f"{split}.jsonl").read_text() == \
            (tmp_path / "pool" / f"{split}.jsonl").read_text()
    one = sorted((tmp_path / "one" / "audio").glob("*/*.flac"))
    assert len(one) == n
    for path in one[::7]:
        twin = tmp_path / "pool" / path.relative_to(tmp_path / "one")
        np.testing.assert_array_equal(soundfile.read(str(path))[0], soundfile.read(str(twin))[0])


@pytest.mark.parametrize("relative", [False, True])
def test_ensure_synthetic_corpus_generates_once(tmp_path, monkeypatch, relative):
    monkeypatch.chdir(tmp_path)
    first = synth.ensure_synthetic_corpus("cache" if relative else str(tmp_path / "cache"), 6, seed=1)
    assert first == str(tmp_path / "cache" / os.path.basename(first))
    # Manifest paths are relative, so they survive the rename from the partial folder.
    train = SpeechDataset(manifest.read_manifest(os.path.join(first, "train.jsonl")))
    assert len(train) == 4 and not train.problems.counts
    assert train.load(0) is not None

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached corpus was generated again")

    monkeypatch.setattr(synth, "generate_corpus", must_not_run)
    assert synth.ensure_synthetic_corpus(str(tmp_path / "cache"), 6, seed=1) == first


def test_interrupted_generation_is_not_reused(tmp_path, monkeypatch):
    real = synth.generate_corpus

    def interrupted(out_dir, *args, **kwargs):
        real(out_dir, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "generate_corpus", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synth.ensure_synthetic_corpus(str(tmp_path), 5, seed=2)
    assert [p for p in os.listdir(tmp_path) if not p.endswith(".lock")] == []
    monkeypatch.setattr(synth, "generate_corpus", real)
    path = synth.ensure_synthetic_corpus(str(tmp_path), 5, seed=2)
    assert len(manifest.read_manifest(os.path.join(path, "train.jsonl"))) == 3


def test_make_corpus_script(tmp_path):
    out = tmp_path / "corpus"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "make_corpus.py"), "--out", str(out),
         "--utterances", "5", "--seed", "4"], capture_output=True, text=True, check=True)
    assert "5 utterances (train 3, dev 1, test 1)" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["audio", "dev.jsonl", "test.jsonl", "train.jsonl"]
    again = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "make_corpus.py"), "--out", str(out)],
        capture_output=True, text=True)
    assert again.returncode != 0 and "not empty" in again.stderr
