"""scripts/train.py against the faults a user meets: reruns, damaged checkpoints, kill -9, bad data, divergence."""

import json
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile

from jaxring.engine.checkpoint import Checkpoints
from tests.tiny_runs import CONFIG, ROOT, TRAIN, tiny_overrides

sys.path.insert(0, str(ROOT / "scripts"))

import train  # noqa: E402

STEPS = 6  # two epochs of three steps, a checkpoint after each


def arguments(workdir, cache, *extra, **values):
    values = {"train.epochs": 2, "eval.every_steps": 3, **values}
    return ["--config", str(CONFIG), "--workdir", str(workdir), *tiny_overrides(cache, **values), *extra]


def run_files(workdir) -> dict:
    return {p.relative_to(workdir): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def assert_same_final_state(a, b):
    template = Checkpoints(a / "checkpoints").read(STEPS)[0]
    ours = Checkpoints(b / "checkpoints").read(STEPS)[0]
    for x, y in zip(*(jax_leaves(t) for t in (template, ours))):
        np.testing.assert_array_equal(x, y)


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def assert_every_checkpoint_finite(workdir):
    checkpoints = Checkpoints(workdir / "checkpoints")
    assert checkpoints.steps()
    for step in checkpoints.steps():
        state = checkpoints.read(step).state  # verifies the checksum and that the state is finite
        for leaf in jax_leaves(state):
            leaf = np.asarray(leaf)
            assert not np.issubdtype(leaf.dtype, np.inexact) or np.isfinite(leaf).all()


@pytest.fixture(scope="module")
def straight(corpus_cache, tmp_path_factory):
    """A finished run, never interrupted."""
    workdir = tmp_path_factory.mktemp("straight") / "run"
    train.main(arguments(workdir, corpus_cache))
    return workdir


def test_rerunning_a_finished_run_without_flags_deletes_nothing(straight, corpus_cache, capsys):
    before = run_files(straight)
    with pytest.raises(SystemExit, match=rf"{straight} holds checkpoints up to step {STEPS}: give --resume .* "
                                         "or --overwrite to start over"):
        train.main(arguments(straight, corpus_cache))
    assert run_files(straight) == before


def test_damaged_newest_checkpoints_are_named_and_the_resume_starts_from_an_intact_one(
        straight, corpus_cache, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(straight, workdir)
    checkpoints = Checkpoints(workdir / "checkpoints")
    assert checkpoints.steps()[-2:] == [STEPS - 1, STEPS]
    newest = checkpoints.path(STEPS)
    newest.write_bytes(newest.read_bytes()[: len(newest.read_bytes()) // 2])  # truncated
    flipped = checkpoints.path(STEPS - 1)
    data = bytearray(flipped.read_bytes())
    data[random.Random(0).randrange(len(data) // 4, len(data))] ^= 0x10  # one bit, inside the arrays
    flipped.write_bytes(bytes(data))
    train.main(arguments(workdir, corpus_cache, "--resume"))
    err = capsys.readouterr().err
    assert f"checkpoint {newest} is damaged" in err and f"checkpoint {flipped} is damaged" in err
    assert_same_final_state(straight, workdir)  # resumed at the intact step STEPS - 2, ended equal


def kill_9_while_training(command, workdir, attempts=6):
    """Runs `command` and kills it with SIGKILL at a random moment after its first checkpoint: mid-step,
    mid-save or mid-evaluation. Once compiled the run ends within about a second, so a moment drawn after it
    wrote its summary (a finished run, which --resume rightly refuses: jaxring/engine/rundir.py) is drawn again
    from a window half as long, on a fresh run."""
    window_s = 1.5
    for _ in range(attempts):
        shutil.rmtree(workdir, ignore_errors=True)
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while not Checkpoints(workdir / "checkpoints").steps():
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.02)
        time.sleep(random.uniform(0, window_s))
        job.send_signal(signal.SIGKILL)
        job.wait()
        if not (workdir / "summary.json").exists():
            return
        window_s /= 2
    pytest.fail(f"the run had finished before each of {attempts} kills")


def test_kill_9_at_a_random_moment_then_resume_ends_bitwise_equal(straight, corpus_cache, tmp_path):
    workdir = tmp_path / "run"
    command = [sys.executable, str(TRAIN), *arguments(workdir, corpus_cache)]
    kill_9_while_training(command, workdir)
    resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_final_state(straight, workdir)
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # every row once, none lost to the kill


def write_manifests(corpus_cache, folder):
    """Manifests of the synthetic corpus; train gains a NaN-audio file and one line of each bad kind."""
    corpus = next(p for p in corpus_cache.glob("espeak-*") if p.is_dir())
    folder.mkdir()
    paths = {}
    for split in ("train", "dev", "test"):
        lines = [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()]
        if split == "train":
            lines = lines[:-1]  # with the NaN file, whole batches of 8: no epoch leaves it out
        for entry in lines:
            entry["audio_filepath"] = str(corpus / entry["audio_filepath"])
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(entry) + "\n" for entry in lines))
    samples, rate = soundfile.read(str(corpus / lines[0]["audio_filepath"]), dtype="float32")
    samples[len(samples) // 3] = np.nan
    soundfile.write(str(folder / "nan.wav"), samples, rate, subtype="FLOAT")
    bad = [
        json.dumps({"audio_filepath": str(folder / "nan.wav"), "duration": len(samples) / rate, "text": "nan"}),
        "{not json",
        json.dumps({"audio_filepath": str(folder / "gone.flac"), "duration": 1.0, "text": "missing file"}),
        json.dumps({"audio_filepath": str(folder / "nan.wav"), "duration": float("nan"), "text": "nan duration"}),
        json.dumps({"audio_filepath": str(folder / "nan.wav"), "duration": 1e6, "text": "a million seconds"}),
        json.dumps({"duration": 1.0, "text": "no audio_filepath"}),
    ]
    with open(paths["train"], "a") as f:
        f.write("\n".join(bad) + "\n")
    return paths, len(bad)


def manifest_arguments(workdir, cache, paths, *extra, **values):
    manifests = {f"data.{split}_manifest": str(path) for split, path in paths.items()}
    return arguments(workdir, cache, *extra, **{"data.corpus": "manifest", **manifests, **values})


def test_bad_data_is_reported_and_never_reaches_a_checkpoint(corpus_cache, tmp_path, capsys):
    paths, n_bad = write_manifests(corpus_cache, tmp_path / "manifests")
    workdir = tmp_path / "run"
    train.main(manifest_arguments(workdir, corpus_cache, paths, **{"data.max_unusable_share": 0.5}))
    out = capsys.readouterr().out
    train_lines = len(paths["train"].read_text().splitlines())
    assert f"data train: {train_lines - n_bad + 1} of {train_lines} utterances usable" in out
    assert train_lines - n_bad + 1 == 24
    report = json.loads((workdir / "data_report.json").read_text())
    assert report["train"]["skipped"] == {
        "bad manifest line": {"count": 4, "first": report["train"]["skipped"]["bad manifest line"]["first"]},
        "missing file": {"count": 1, "first": [str(paths["train"].parent / "gone.flac")]},
    }
    first = report["train"]["skipped"]["bad manifest line"]["first"]
    assert [line.split(" ")[0] for line in first] == [f"{paths['train']}:{train_lines - n_bad + k}" for k in (2, 4, 5)]
    assert report["dev"]["skipped"] == {} and report["dev"]["usable"] == report["dev"]["utterances"]
    # The NaN file passes the header checks: it is skipped when loaded, and named then, once.
    assert f"{paths['train'].parent / 'nan.wav'}" not in json.dumps(report)
    assert out.count(f"data: skipped {paths['train'].parent / 'nan.wav'}: non-finite audio samples (1 samples)") == 1
    assert_every_checkpoint_finite(workdir)


def test_too_much_bad_data_stops_before_the_first_step(corpus_cache, tmp_path):
    paths, n_bad = write_manifests(corpus_cache, tmp_path / "manifests")
    workdir = tmp_path / "run"
    with pytest.raises(SystemExit, match=rf"manifest {paths['train']}: {n_bad - 1} of \d+ utterances are "
                                         r"unusable .* more than the 10% allowed \(data.max_unusable_share\)"):
        train.main(manifest_arguments(workdir, corpus_cache, paths))
    assert not (workdir / "checkpoints").exists()


def test_a_diverging_run_names_the_batch_and_writes_no_non_finite_checkpoint(corpus_cache, tmp_path):
    workdir = tmp_path / "run"
    values = {"optim.learning_rate": 1e30, "optim.clip_norm": None, "optim.warmup_steps": 0}
    with pytest.raises(SystemExit, match=r"loss is (nan|inf) at step \d on a batch of .*\.flac.*; no checkpoint "
                                         "of this step or later is written") as error:
        train.main(arguments(workdir, corpus_cache, **values))
    failed_step = int(str(error.value).split(" at step ")[1].split(" ")[0])
    steps = Checkpoints(workdir / "checkpoints").steps()
    assert all(step < failed_step for step in steps)
    if steps:
        assert_every_checkpoint_finite(workdir)
