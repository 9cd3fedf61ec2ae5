"""examples/nnx_classifier: a Flax NNX model (BatchNorm, Dropout) through the engine with no glue in the task
(jaxring/engine/nnx_task.py): trained, resumed bit for bit as if never stopped, evaluated, and under mpirun."""

import json
import sys

import numpy as np
import pytest

from jaxring.engine.checkpoint import Checkpoints
from tests.tiny_runs import ROOT, finish, mpirun

CONFIG = ROOT / "examples" / "nnx_classifier" / "nnx_classifier.yaml"
SHORT = ["--set", "train.max_steps=20", "--set", "eval.every_steps=10", "--set", "checkpoint.every_steps=10",
         "--set", "train.log_every=1"]
sys.path.insert(0, str(ROOT / "scripts"))

import evaluate  # noqa: E402
import train  # noqa: E402


def rows(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """In this process (8 devices): 20 steps at once, and 10 steps resumed to 20; (the first, the second)."""
    whole, stopped = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("stopped")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "examples"))
        train.main(["--config", str(CONFIG), "--workdir", str(whole), *SHORT])
        train.main(["--config", str(CONFIG), "--workdir", str(stopped), *SHORT, "--set", "train.max_steps=10"])
        train.main(["--workdir", str(stopped), "--resume", "--set", "train.max_steps=20"])
    return whole, stopped


def test_the_nnx_classifier_learns(runs):
    whole, _ = runs
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["test_error_rate"] < 0.3, summary  # chance: 75%
    losses = [row["loss"] for row in rows(whole)]
    assert losses[-1] < losses[0] / 2


def test_a_resumed_run_is_the_uninterrupted_one_bit_for_bit(runs):
    whole, stopped = runs
    assert [row["loss"] for row in rows(stopped)] == [row["loss"] for row in rows(whole)]
    read = [Checkpoints(run / "checkpoints").read(20).state for run in runs]
    flat = [{path: leaf for path, leaf in _flat(state)} for state in read]
    assert flat[0].keys() == flat[1].keys() and any("count" in path for path in flat[0])
    for path, leaf in flat[0].items():
        assert flat[1][path].dtype == leaf.dtype, path
        np.testing.assert_array_equal(flat[1][path], leaf, err_msg=path)


def _flat(tree, path=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat(value, f"{path}/{key}")
    else:
        yield path, np.asarray(tree)


def test_evaluate_scores_the_best_checkpoint_as_training_did(runs, capsys, monkeypatch):
    whole, _ = runs
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    capsys.readouterr()
    evaluate.main(["--workdir", str(whole)])
    result = json.loads(capsys.readouterr().out)
    summary = json.loads((whole / "summary.json").read_text())
    assert result == {"split": "test", "error_rate": summary["test_error_rate"], "step": summary["test_step"]}


def test_two_processes_under_mpirun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, output = finish(mpirun(2, [ROOT / "scripts" / "train.py", "--config", CONFIG, "--workdir", "mpi", *SHORT],
                                 env={"PYTHONPATH": str(ROOT / "examples")}, with_mpi4py=True, devices_per_proc=1),
                          timeout_s=200)
    assert code == 0, output
    summary = json.loads((tmp_path / "mpi" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["test_error_rate"] < 0.3, summary
