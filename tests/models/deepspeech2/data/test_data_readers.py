"""Audio files, manifests and the LibriSpeech layout."""

import json
import re

import numpy as np
import pytest

from models.deepspeech2.data import audio, librispeech, manifest
from models.deepspeech2.data import problems as P
from models.deepspeech2.data.dataset import SpeechDataset

from speech_data_helpers import write_broken_files, write_tone


def dominant_frequency(samples, rate):
    spectrum = np.abs(np.fft.rfft(samples))
    return np.fft.rfftfreq(len(samples), 1 / rate)[spectrum.argmax()]


def test_read_audio_16k_as_is(tmp_path):
    tone = write_tone(tmp_path / "a.wav", subtype="FLOAT")
    samples, resampled = audio.read_audio(str(tmp_path / "a.wav"))
    assert not resampled and samples.dtype == np.float32
    np.testing.assert_array_equal(samples, tone)


@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_read_audio_resamples(tmp_path, rate):
    write_tone(tmp_path / "a.flac", seconds=0.75, rate=rate, freq=440.0)
    samples, resampled = audio.read_audio(str(tmp_path / "a.flac"))
    assert resampled
    assert abs(len(samples) - 12000) <= 1
    assert abs(dominant_frequency(samples, 16000) - 440.0) < 2.0


def test_read_audio_mixes_channels_to_mono(tmp_path):
    tone = write_tone(tmp_path / "s.wav", channels=2, subtype="FLOAT")
    samples, _ = audio.read_audio(str(tmp_path / "s.wav"))
    np.testing.assert_allclose(samples, tone, atol=1e-7)


def test_broken_audio_raises_audio_error(tmp_path):
    for name, path in write_broken_files(tmp_path).items():
        with pytest.raises(audio.AudioError):
            audio.read_audio(str(path))
    with pytest.raises(FileNotFoundError):
        audio.read_audio(str(tmp_path / "nowhere.flac"))


def test_manifest_paths_resolve_against_its_folder(tmp_path):
    (tmp_path / "corpus" / "wavs").mkdir(parents=True)
    write_tone(tmp_path / "corpus" / "wavs" / "x.wav", seconds=0.5)
    path = tmp_path / "corpus" / "m.jsonl"
    manifest.write_manifest(str(path), [
        {"audio_filepath": str(tmp_path / "corpus" / "wavs" / "x.wav"), "duration": 0.5,
         "text": "Hello, World!"},
        {"audio_filepath": "/elsewhere/y.wav", "duration": 1.0, "text": "y"},
    ])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["audio_filepath"] == "wavs/x.wav"  # relative: the folder can move
    assert lines[1]["audio_filepath"] == "/elsewhere/y.wav"
    moved = tmp_path / "moved"
    (tmp_path / "corpus").rename(moved)
    utterances = manifest.read_manifest(str(moved / "m.jsonl"))
    assert utterances[0] == manifest.Utterance(str(moved / "wavs" / "x.wav"), 0.5, "Hello, World!")
    assert utterances[1].audio_filepath == "/elsewhere/y.wav"


def test_bad_manifest_lines_are_skipped_or_raise(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"audio_filepath": "a.wav", "duration": 1, "text": "a"}\n'
                    "not json\n\n"
                    '{"audio_filepath": "b.wav", "duration": "long", "text": "bad duration"}\n'
                    '["a list"]\n')
    problems = P.Problems()
    assert len(manifest.read_manifest(str(path), problems)) == 1
    assert problems.counts == {P.BAD_MANIFEST_LINE: 3}
    with pytest.raises(P.DataError, match=r"m\.jsonl:2: bad manifest line"):
        manifest.read_manifest(str(path), P.Problems(strict=True))


@pytest.mark.parametrize("line, message", [
    ('{"path": "a.wav", "duration": 1, "text": "a"}', r"m\.jsonl:3\b.*no key 'audio_filepath'.*rename 'path'"),
    ('{"audio_filepath": "a.wav", "seconds": 1, "text": "a"}', r"m\.jsonl:3\b.*no key 'duration'"),
    ('{"audio_filepath": "a.wav", "duration": 1, "transcript": "a"}', r"m\.jsonl:3\b.*no key 'text'.*rename 'transcript'"),
])
def test_a_missing_key_is_reported_with_the_key_and_the_line(tmp_path, line, message):
    path = tmp_path / "m.jsonl"
    good = '{"audio_filepath": "a.wav", "duration": 1, "text": "a"}\n'
    path.write_text(good + "\n" + line + "\n" + good)
    problems = P.Problems()
    assert len(manifest.read_manifest(str(path), problems)) == 2
    assert re.search(message, " ".join(problems.report()[P.BAD_MANIFEST_LINE]["first"]))
    with pytest.raises(P.DataError, match=message):
        manifest.read_manifest(str(path), P.Problems(strict=True))


def make_librispeech(root):
    """dev-tiny/<speaker>/<chapter>: 5 listed utterances, one at 22.05 kHz, one missing."""
    listed = {
        ("19", "198"): {"19-198-0000": "NORTHANGER ABBEY", "19-198-0001": "IT'S A TRUTH",
                        "19-198-0002": "THE MISSING ONE"},
        ("26", "495"): {"26-495-0000": "CHAPTER ONE", "26-495-0001": "SHE SAID NO"},
    }
    for (speaker, chapter), lines in listed.items():
        folder = root / "dev-tiny" / speaker / chapter
        folder.mkdir(parents=True)
        (folder / f"{speaker}-{chapter}.trans.txt").write_text(
            "".join(f"{key} {text}\n" for key, text in lines.items()))
        for i, key in enumerate(lines):
            if key != "19-198-0002":
                rate = 22050 if key == "26-495-0001" else 16000
                write_tone(folder / f"{key}.flac", seconds=0.5 + 0.25 * i, rate=rate)


def test_librispeech_reader(tmp_path):
    make_librispeech(tmp_path)
    problems = P.Problems()
    utterances = librispeech.read_librispeech(str(tmp_path), ["dev-tiny"], problems)
    assert problems.counts == {P.MISSING_FILE: 1}
    by_name = {u.audio_filepath.rsplit("/", 1)[1]: u for u in utterances}
    assert sorted(by_name) == ["19-198-0000.flac", "19-198-0001.flac",
                               "26-495-0000.flac", "26-495-0001.flac"]
    assert by_name["19-198-0001.flac"].duration == pytest.approx(0.75)
    assert by_name["26-495-0001.flac"].duration == pytest.approx(0.75, abs=1e-4)
    dataset = SpeechDataset(utterances)
    assert sorted(dataset.texts) == ["chapter one", "it's a truth", "northanger abbey", "she said no"]
    example = dataset.load(dataset.texts.index("she said no"))
    assert example.features.shape == (1 + (12000 - 320) // 160, 161)
    assert dataset.problems.counts == {P.RESAMPLED: 1}
    # The subset folder itself can be the root.
    assert len(librispeech.read_librispeech(str(tmp_path / "dev-tiny"))) == 4


def test_librispeech_manifest_round_trip(tmp_path):
    make_librispeech(tmp_path / "LibriSpeech")
    out = tmp_path / "dev.jsonl"
    assert librispeech.write_librispeech_manifest(str(tmp_path / "LibriSpeech"), ["dev-tiny"], str(out)) == 4
    read = manifest.read_manifest(str(out))
    direct = librispeech.read_librispeech(str(tmp_path / "LibriSpeech"), ["dev-tiny"])
    assert [(u.audio_filepath, u.text) for u in read] == [(u.audio_filepath, u.text) for u in direct]


def test_librispeech_reader_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="trans.txt"):
        librispeech.read_librispeech(str(tmp_path), ["train-clean-100"])
