"""Bad input is skipped and counted (or raises with strict=True); it never stops a run."""

import logging

import numpy as np
import pytest
import soundfile

from models.deepspeech2.data import manifest
from models.deepspeech2.data import problems as P
from models.deepspeech2.data.batching import BatchIterator
from models.deepspeech2.data.dataset import SpeechDataset, ctc_min_frames, lost_characters
from speech_data_helpers import write_broken_files, write_tone


def output_frames(frames):
    """A model that halves time twice."""
    return (frames + 3) // 4


@pytest.fixture
def messy_manifest(tmp_path, tiny_corpus):
    good = manifest.read_manifest(str(tiny_corpus / "train.jsonl"))[:6]
    broken = write_broken_files(tmp_path / "broken")
    write_tone(tmp_path / "8k.wav", seconds=1.0, rate=8000)
    write_tone(tmp_path / "short.wav", seconds=0.3)
    entries = [{"audio_filepath": u.audio_filepath, "duration": u.duration, "text": u.text}
               for u in good]
    entries += [
        {"audio_filepath": str(broken["truncated"]), "duration": 2.0, "text": "truncated"},
        {"audio_filepath": str(broken["random"]), "duration": 1.0, "text": "random bytes"},
        {"audio_filepath": str(broken["empty"]), "duration": 1.0, "text": "empty file"},
        {"audio_filepath": str(tmp_path / "8k.wav"), "duration": 1.0, "text": "eight k"},
        {"audio_filepath": str(tmp_path / "gone.flac"), "duration": 1.0, "text": "missing"},
        {"audio_filepath": good[0].audio_filepath, "duration": 1.0, "text": " ?! "},
        {"audio_filepath": good[0].audio_filepath, "duration": 1.0, "text": "call 911"},
        {"audio_filepath": good[0].audio_filepath, "duration": 30.0, "text": "too long"},
        {"audio_filepath": good[0].audio_filepath, "duration": 1.0, "text": "word " * 40},
        # The manifest says 2 s; the file holds 0.3 s: only loading can tell.
        {"audio_filepath": str(tmp_path / "short.wav"), "duration": 2.0, "text": "x" * 20},
    ]
    path = tmp_path / "messy.jsonl"
    manifest.write_manifest(str(path), entries)
    with open(path, "a") as f:
        f.write("{not json\n")
    return path


def test_lost_characters():
    assert lost_characters("Hello, World! It's café-au-lait.") == set()
    assert lost_characters("call 911 now") == {"9", "1"}
    assert lost_characters("straße Ωmega") == {"ß", "ω"}


def test_ctc_min_frames():
    assert ctc_min_frames(np.array([1, 2, 3])) == 3
    assert ctc_min_frames(np.array([1, 1, 2, 2, 2])) == 8
    assert ctc_min_frames(np.array([], np.int32)) == 0


def test_bad_input_is_skipped_counted_and_summarised(messy_manifest, caplog):
    problems = P.Problems()
    utterances = manifest.read_manifest(str(messy_manifest), problems)
    dataset = SpeechDataset(utterances, max_duration=20.0, output_frames=output_frames,
                            problems=problems)
    assert problems.counts == {
        P.BAD_MANIFEST_LINE: 1, P.MISSING_FILE: 1, P.EMPTY_TRANSCRIPT: 1,
        P.UNKNOWN_CHARACTERS: 1, P.TOO_LONG: 1, P.LABELS_TOO_LONG: 1,
        P.UNREADABLE_AUDIO: 2,  # random bytes and the empty file: their headers say so already
    }
    assert len(dataset) == 6 + 3  # good ones, the truncated file, the 8 kHz one, the short one

    with caplog.at_level(logging.INFO, logger="models.deepspeech2.data.batching"):
        with BatchIterator(dataset, per_device_batch=2, local_devices=2, num_epochs=2,
                           drop_last=False) as batches:
            seen = list(batches)
    assert len(seen) == 2 * 3
    for batch in seen:  # every row that failed to load has weight 0 and borrowed a good row
        dead = batch["weights"] == 0
        assert (batch["feature_lengths"][dead] > 0).sum() + (batch["feature_lengths"] == 0).sum() \
            == dead.sum()
    used = sorted(t for b in seen[:3] for t, w in zip(b["texts"], b["weights"].ravel()) if w)
    assert "eight k" in used and "truncated" not in used and len(used) == 7
    epoch_lines = [r.message for r in caplog.records if r.message.startswith("data epoch")]
    assert len(epoch_lines) == 2
    for line in epoch_lines:
        assert "skipped 2 (labels longer than output frames: 1, unreadable audio: 1)" in line
        assert "resampled 1" in line
    assert any("dataset: 9 utterances usable, skipped 8" in r.message for r in caplog.records)


@pytest.mark.parametrize("text,reason", [
    (" ?! ", "empty transcript"), ("call 911", "unknown characters"),
    ("word " * 40, "labels longer than output frames"),
])
def test_strict_raises_on_metadata(tiny_corpus, text, reason):
    good = manifest.read_manifest(str(tiny_corpus / "train.jsonl"))[0]
    bad = manifest.Utterance(good.audio_filepath, 1.0, text)
    with pytest.raises(P.DataError, match=f"{good.audio_filepath}: {reason}"):
        SpeechDataset([good, bad], output_frames=output_frames, strict=True)


def test_strict_raises_on_broken_audio_while_iterating(tmp_path, tiny_corpus):
    good = manifest.read_manifest(str(tiny_corpus / "train.jsonl"))[:3]
    broken = write_broken_files(tmp_path)["truncated"]
    dataset = SpeechDataset(good + [manifest.Utterance(str(broken), 9.0, "truncated")], strict=True)
    batches = BatchIterator(dataset, per_device_batch=4)
    with pytest.raises(P.DataError, match=rf"{broken}: unreadable audio \("):
        next(batches)
    assert batches._thread is None  # the prefetch thread is gone


def test_describe():
    assert P.describe(P.Problems().counts) == "nothing skipped"
    problems = P.Problems()
    problems.skip(P.MISSING_FILE, "a")
    problems.note(P.RESAMPLED)
    assert P.describe(problems.counts) == "skipped 1 (missing file: 1), resampled 1"
    assert problems.skipped == 1


def test_each_kind_of_bad_manifest_line_is_counted_with_its_line(tmp_path, tiny_corpus):
    good = (tiny_corpus / "train.jsonl").read_bytes().splitlines()[:3]
    bad = [
        b"{not json", b"\xff\xfe\x00binary", b"[1, 2]", b'{"duration": 1.0, "text": "no path"}',
        b'{"audio_filepath": "a.flac", "duration": NaN, "text": "nan"}',
        b'{"audio_filepath": "a.flac", "duration": 1e6, "text": "a million seconds"}',
        b'{"audio_filepath": "a.flac", "duration": -2, "text": "negative"}',
        b'{"audio_filepath": "a.flac", "duration": true, "text": "bool"}',
        b'{"audio_filepath": "a.flac", "duration": "1.5", "text": "string"}',
        b'{"audio_filepath": 7, "duration": 1.5, "text": "number path"}',
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(good[:1] + bad + good[1:]) + b"\n")
    problems = P.Problems()
    utterances = manifest.read_manifest(str(path), problems)
    assert [u.text for u in utterances] == [manifest.read_manifest(str(tiny_corpus / "train.jsonl"))[i].text
                                            for i in range(3)]
    assert problems.counts == {P.BAD_MANIFEST_LINE: len(bad)}
    assert problems.unusable == {f"{path}:{n}" for n in range(2, 2 + len(bad))}
    first = problems.report()[P.BAD_MANIFEST_LINE]["first"]
    assert len(first) == P.NAMED_PER_REASON and first[0].startswith(f"{path}:2 (JSONDecodeError")
    assert "UnicodeDecodeError" in first[1] and "a JSON object" in first[2]


def test_an_unreadable_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(P.DataError, match=f"manifest {tmp_path / 'nope.jsonl'} cannot be read"):
        manifest.read_manifest(str(tmp_path / "nope.jsonl"))
    with pytest.raises(P.DataError, match=f"manifest {tmp_path} cannot be read"):
        manifest.read_manifest(str(tmp_path))


@pytest.mark.parametrize("n_bad, share, stops", [(0, 0.1, False), (2, 0.1, False), (3, 0.1, True),
                                                 (20, 1.0, True), (19, 1.0, False)])
def test_too_many_unusable_utterances_stop(tiny_corpus, n_bad, share, stops):
    utterances = manifest.read_manifest(str(tiny_corpus / "train.jsonl"))[:20]
    utterances = [manifest.Utterance(u.audio_filepath + ("-gone" if i < n_bad else ""), u.duration, u.text)
                  for i, u in enumerate(utterances)]
    build = lambda: SpeechDataset(utterances, max_unusable_share=share, name="split X")  # noqa: E731
    if not stops:
        assert len(build()) == 20 - n_bad
        return
    with pytest.raises(P.DataError, match=rf"split X: {n_bad} of 20 utterances are unusable \(skipped {n_bad} "
                                          rf"\(missing file: {n_bad}\); first: missing file: .*-gone"):
        build()


def test_non_finite_audio_is_skipped_and_named(tmp_path, tiny_corpus):
    good = manifest.read_manifest(str(tiny_corpus / "train.jsonl"))[:3]
    samples = np.random.default_rng(0).uniform(-0.5, 0.5, 16000).astype(np.float32)
    samples[[5, 700]] = [np.nan, np.inf]
    soundfile.write(str(tmp_path / "nan.wav"), samples, 16000, subtype="FLOAT")
    dataset = SpeechDataset(good + [manifest.Utterance(str(tmp_path / "nan.wav"), 1.0, "not a number")])
    assert dataset.load(3) is None and dataset.load(0) is not None
    assert dataset.problems.report() == {
        P.NON_FINITE_AUDIO: {"count": 1, "first": [f"{tmp_path / 'nan.wav'} (2 samples)"]}
    }
