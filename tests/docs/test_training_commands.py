"""docs/TRAINING.md's own-data commands, run as written from a directory of their own: make_manifest
on a relative folder of clips (a tiny set synthesised here, with a bad file and a transcript with
digits), train.py on the manifests, transcribe.py on several files with a broken one, evaluate.py
with the run's LM. Only the model is shrunk (--set), so each command takes seconds."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.docs.markdown import ROOT, command
from tests.tiny_runs import tiny_overrides

DOC = "docs/TRAINING.md"


def as_written(words: list[str]) -> list[str]:
    """A documented command with `python` this interpreter and the checkout's scripts and configs."""
    return [sys.executable if word == "python" else str(ROOT / word) if word.startswith(("scripts/", "configs/"))
            else word for word in words]


def run_in(cwd, words, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    return subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    """A directory with clips/ (30 synthesised utterances, NNNN.flac + NNNN.txt, plus a file that is
    no audio and one whose transcript has digits), after the documented make_manifest and train."""
    from models.deepspeech2.data import ensure_synthetic_corpus, read_manifest

    tmp = tmp_path_factory.mktemp("own_data")
    corpus = ensure_synthetic_corpus(str(tmp / "cache"), utterances=30, seed=4)
    work = tmp / "work"
    (work / "clips").mkdir(parents=True)
    utterances = [u for split in ("train", "dev", "test") for u in read_manifest(f"{corpus}/{split}.jsonl")]
    for i, u in enumerate(utterances):
        shutil.copy(u.audio_filepath, work / "clips" / f"{i:04d}.flac")
        (work / "clips" / f"{i:04d}.txt").write_text(u.text + "\n")
    (work / "clips" / "0998.flac").write_bytes(np.random.default_rng(0).integers(0, 256, 999, np.uint8).tobytes())
    (work / "clips" / "0998.txt").write_text("static\n")
    shutil.copy(work / "clips" / "0000.flac", work / "clips" / "0999.flac")
    (work / "clips" / "0999.txt").write_text("take 42 steps\n")
    manifests = run_in(work, as_written(command(DOC, "python scripts/make_manifest.py --folder clips ")))
    assert manifests.returncode == 0, manifests.stderr
    train = as_written(command(DOC, "python scripts/train.py --config configs/ds2_tiny.yaml --set data.manifest_dir="))
    trained = run_in(work, train + tiny_overrides(tmp / "cache"))
    return work, utterances, manifests, trained


def test_make_manifest_and_train_on_a_relative_folder(own_data):
    work, utterances, manifests, trained = own_data
    assert "data/mine/train.jsonl: 24 utterances" in manifests.stdout  # 30 * 0.8
    assert "clips/0999.flac: unknown characters ('42' in transcript 'take 42 steps')" in manifests.stderr
    assert "clips/0998.flac: unreadable audio" in manifests.stderr
    assert "skipped 2 (unknown characters: 1, unreadable audio: 1)" in manifests.stdout
    assert json.loads((work / "data" / "mine" / "dev.jsonl").read_text().splitlines()[0])["audio_filepath"].startswith(
        "../../clips/")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "data train: 24 of 24 utterances usable" in trained.stdout
    assert "on the test manifest" in trained.stdout and "data/mine/test.jsonl" in trained.stdout
    assert json.loads((work / "runs" / "mine" / "summary.json").read_text())["steps"] == 3


def test_transcribe_several_files_with_a_broken_one(own_data):
    work, utterances, _, trained = own_data
    assert trained.returncode == 0
    words = command(DOC, "python scripts/transcribe.py --workdir runs/ds2_tiny a.flac b.wav")
    words = [("runs/mine" if word == "runs/ds2_tiny" else word) for word in words] + ["c.flac"]
    shutil.copy(work / "clips" / "0001.flac", work / "a.flac")
    (work / "b.wav").write_bytes(b"RIFF, but nothing more")
    shutil.copy(work / "clips" / "0002.flac", work / "c.flac")
    finished = run_in(work, as_written(words))
    assert finished.returncode == 1  # one file failed
    lines = [line.split("\t") for line in finished.stdout.splitlines()]
    assert [name for name, _ in lines] == ["a.flac", "b.wav", "c.flac"]  # every file, in order
    assert lines[1][1].startswith("error: unreadable audio")
    assert all(set(text) <= set("abcdefghijklmnopqrstuvwxyz' ") for _, text in (lines[0], lines[2]))
    assert "error: b.wav: unreadable audio" in finished.stderr


def test_evaluate_with_the_runs_lm(own_data):
    work, _, _, trained = own_data
    assert trained.returncode == 0
    words = command(DOC, "python scripts/evaluate.py --workdir runs/ds2_tiny --beam-width 16 --lm runs/ds2_tiny/lm.arpa")
    finished = run_in(work, as_written([word.replace("runs/ds2_tiny", "runs/mine") for word in words]))
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.splitlines()[-1])
    summary = json.loads((work / "runs" / "mine" / "summary.json").read_text())
    assert result["cer"] == pytest.approx(summary["test_beam_cer"]) and result["lm"] == str(work / "runs/mine/lm.arpa")
