"""Manifests from folders of real audio files: scripts/make_manifest.py and data/folders.py."""

import json
import sys
from pathlib import Path

import pytest

from models.deepspeech2.data import folders, manifest
from models.deepspeech2.data import problems as P
from models.deepspeech2.task import DataConfig, DeepSpeech2Task
from models.deepspeech2.model import ModelConfig

from speech_data_helpers import write_broken_files, write_tone

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "scripts"))

import make_manifest  # noqa: E402

# name: (seconds, sample rate, transcript); odd lengths and rates
CLIPS = {
    "a/one": (0.41, 16000, "Hello there"),
    "a/two": (1.07, 22050, "see you later"),
    "b/three": (0.77, 8000, "It's quiet!"),
    "b/four": (0.53, 44100, "good night"),
    "five": (1.31, 16000, "turn on the light"),
    "six": (0.29, 48000, "zero one two"),
    "seven": (0.97, 16000, "open the door"),
}


def make_folder(root, extension=".wav"):
    """CLIPS as audio files with a .txt transcript beside each."""
    for name, (seconds, rate, text) in CLIPS.items():
        path = root / (name + extension)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tone(path, seconds=seconds, rate=rate, freq=300 + 50 * len(name))
        path.with_suffix(".txt").write_text(text + "\n")
    return root


def entries(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_folder_with_transcripts_beside_the_audio(tmp_path):
    make_folder(tmp_path / "audio", ".flac")
    write_tone(tmp_path / "audio" / "untranscribed.wav", seconds=0.3)
    write_broken_files(tmp_path / "audio" / "broken")  # no transcripts: skipped as missing
    (tmp_path / "audio" / "b" / "notes.txt").write_text("a transcript without audio is ignored")
    problems = P.Problems()
    utterances = folders.read_folder(str(tmp_path / "audio"), problems)
    assert problems.counts == {P.MISSING_TRANSCRIPT: 5}
    by_name = {Path(u.audio_filepath).relative_to(tmp_path / "audio").with_suffix("").as_posix(): u
               for u in utterances}
    assert by_name.keys() == CLIPS.keys()
    for name, (seconds, rate, text) in CLIPS.items():
        assert by_name[name].text == text
        assert by_name[name].duration == pytest.approx(int(seconds * rate) / rate)  # write_tone: int(seconds * rate) samples


def test_a_broken_file_with_a_transcript_is_skipped_as_unreadable(tmp_path):
    files = write_broken_files(tmp_path)
    for path in [*files.values(), tmp_path / "good.flac"]:
        path.with_suffix(".txt").write_text("words")
    problems = P.Problems()
    kept = folders.read_folder(str(tmp_path), problems)
    # The truncated flac has a sound header, so its duration reads (loading it for training
    # then skips it); random bytes and an empty file do not.
    assert sorted(Path(u.audio_filepath).name for u in kept) == ["good.flac", "truncated.flac"]
    assert problems.counts == {P.UNREADABLE_AUDIO: 2}


def test_make_manifest_splits_a_folder_into_train_dev_test(tmp_path, capsys):
    make_folder(tmp_path / "audio")
    counts = make_manifest.main(["--folder", str(tmp_path / "audio"), "--out", str(tmp_path / "m"),
                                 "--split", "0.6,0.2,0.2", "--seed", "3"])
    assert counts == {"train": 5, "dev": 1, "test": 1}  # 7 * 0.2 = 1.4 rounds to 1
    parts = {s: entries(tmp_path / "m" / f"{s}.jsonl") for s in ("train", "dev", "test")}
    paths = [e["audio_filepath"] for part in parts.values() for e in part]
    assert len(paths) == len(set(paths)) == len(CLIPS)  # a partition: each clip once
    assert all(path.startswith("../audio/") for path in paths)  # relative to the manifest's folder
    for split in parts:
        for u in manifest.read_manifest(str(tmp_path / "m" / f"{split}.jsonl")):
            seconds, rate, text = CLIPS[Path(u.audio_filepath).with_suffix("").relative_to(
                tmp_path / "audio").as_posix()]
            assert u.text == text and u.duration == pytest.approx(seconds, abs=1e-3)
    again = make_manifest.main(["--folder", str(tmp_path / "audio"), "--out", str(tmp_path / "again"),
                                "--split", "0.6,0.2,0.2", "--seed", "3"])
    assert again == counts and entries(tmp_path / "again" / "dev.jsonl") == parts["dev"]
    assert "m/train.jsonl: 5 utterances" in capsys.readouterr().out


def test_make_manifest_from_a_csv(tmp_path):
    make_folder(tmp_path / "audio")
    rows = ["speaker,path,text"] + [f"x,audio/{name}.wav,\"{text}\"" for name, (_, _, text) in CLIPS.items()]
    rows.append("x,audio/not_there.wav,lost")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    assert make_manifest.main(["--csv", str(tmp_path / "list.csv"), "--out", str(tmp_path / "m")]) == {"all": 7}
    read = manifest.read_manifest(str(tmp_path / "m" / "all.jsonl"))
    assert [u.text for u in read] == [text for _, _, text in CLIPS.values()]
    assert read[0].audio_filepath == str(tmp_path / "audio" / "a" / "one.wav")


def test_make_manifest_errors_say_what_to_fix(tmp_path):
    (tmp_path / "list.csv").write_text("file,transcript\na.wav,hello\n")
    with pytest.raises(SystemExit, match=r"list\.csv:1: the header row has no column 'path', 'text'"):
        make_manifest.main(["--csv", str(tmp_path / "list.csv"), "--out", str(tmp_path / "m")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no audio files"):
        make_manifest.main(["--folder", str(tmp_path / "empty"), "--out", str(tmp_path / "m")])
    with pytest.raises(SystemExit):
        make_manifest.main(["--folder", str(tmp_path), "--out", str(tmp_path / "m"), "--split", "0.8,0.3,0.1"])


def test_the_task_reads_a_manifest_folder(tmp_path):
    make_folder(tmp_path / "audio")
    make_manifest.main(["--folder", str(tmp_path / "audio"), "--out", str(tmp_path / "m"), "--split", "0.6,0.2,0.2"])
    data = DataConfig(manifest_dir=str(tmp_path / "m"))
    assert data.source == "manifest" and data.describe() == f"test manifest {tmp_path / 'm' / 'test.jsonl'}"
    task = DeepSpeech2Task(ModelConfig(conv_layers=1, conv_channels=(2,), rnn_layers=1, rnn_hidden=8), data)
    assert task.manifests == {s: str(tmp_path / "m" / f"{s}.jsonl") for s in ("train", "dev", "test")}
    assert len(task.dataset(task.manifests["test"])) == 1
    with pytest.raises(P.DataError, match="has no train.jsonl.*make_manifest.py --split"):
        _ = DeepSpeech2Task(task.model_config, DataConfig(manifest_dir=str(tmp_path))).manifests


def test_make_manifest_with_relative_folders_from_any_directory(tmp_path, monkeypatch):
    """The documented own-data commands with relative --folder and --out: the task reads every
    utterance, from the directory they ran in and from another one, and after the whole tree moves."""
    make_folder(tmp_path / "work" / "clips")
    monkeypatch.chdir(tmp_path / "work")
    make_manifest.main(["--folder", "clips", "--split", "0.6,0.2,0.2", "--out", "data/mine"])
    assert entries(Path("data/mine/test.jsonl"))[0]["audio_filepath"].startswith("../../clips/")
    model = ModelConfig(conv_layers=1, conv_channels=(2,), rnn_layers=1, rnn_hidden=8)
    for workdir, moved in ((tmp_path, tmp_path / "work"), (tmp_path, tmp_path / "moved")):
        if not moved.exists():
            (tmp_path / "work").rename(moved)
        monkeypatch.chdir(workdir)
        task = DeepSpeech2Task(model, DataConfig(manifest_dir=str(moved / "data" / "mine")))
        assert sum(len(task.dataset(task.manifests[s])) for s in ("train", "dev", "test")) == len(CLIPS)


def test_a_manifest_of_missing_files_is_refused_naming_the_path_rule(tmp_path):
    (tmp_path / "m").mkdir()
    for split in ("train", "dev", "test"):  # paths relative to the current directory, not the manifest's
        (tmp_path / "m" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"audio_filepath": f"clips/{i}.wav", "duration": 1.0, "text": "hi"}) + "\n"
                    for i in range(3)))
    task = DeepSpeech2Task(ModelConfig(conv_layers=1, conv_channels=(2,), rnn_layers=1, rnn_hidden=8),
                           DataConfig(manifest_dir=str(tmp_path / "m")))
    with pytest.raises(P.DataError, match=r"3 of 3 utterances are unusable .*"
                       + str(tmp_path / "m" / "clips" / "0.wav").replace(".", r"\.")
                       + r".*\. Missing file: a relative audio path in a manifest .* is relative to that file's folder, "
                       r"not to the current directory .*more than the 10% allowed"):
        task.dataset(task.manifests["train"])


def test_make_manifest_names_each_skipped_file_and_refuses_digits(tmp_path, capsys):
    make_folder(tmp_path / "audio")
    write_tone(tmp_path / "audio" / "untranscribed.wav", seconds=0.3)
    write_tone(tmp_path / "audio" / "number.wav", seconds=0.4)
    (tmp_path / "audio" / "number.txt").write_text("take 42 steps\n")
    (tmp_path / "audio" / "noise.wav").write_bytes(b"RIFF not really audio")
    (tmp_path / "audio" / "noise.txt").write_text("static")
    counts = make_manifest.main(["--folder", str(tmp_path / "audio"), "--out", str(tmp_path / "m")])
    assert counts == {"all": len(CLIPS)}
    out, err = capsys.readouterr()
    assert f"skipped {tmp_path / 'audio' / 'untranscribed.wav'}: missing transcript (no " in err
    assert f"skipped {tmp_path / 'audio' / 'number.wav'}: unknown characters ('42' in transcript 'take 42 steps')" in err
    assert f"skipped {tmp_path / 'audio' / 'noise.wav'}: unreadable audio" in err
    assert "skipped 3 (missing transcript: 1, unknown characters: 1, unreadable audio: 1)" in out
    assert "'42' -> 'forty two'" in out and "NAME.txt beside it" in out


@pytest.mark.parametrize("keys, message", [
    (dict(corpus="synthetic", manifest_dir="m"), "data.corpus is 'synthetic' but data.manifest_dir"),
    (dict(manifest_dir="m", test_manifest="t.jsonl"), "data.manifest_dir and data.test_manifest are both set"),
    (dict(corpus="manifest"), "data.train_manifest, data.dev_manifest, data.test_manifest not set"),
    (dict(corpus="librispeech"), "must be 'synthetic' or 'manifest'"),
])
def test_data_config_errors(keys, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**keys)


def test_the_synthetic_corpus_is_the_default():
    assert DataConfig().source == "synthetic" and "held-out voices" in DataConfig().describe()
