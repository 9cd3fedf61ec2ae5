"""examples/classifier: a task from outside the checkout's models/, trained by scripts/train.py with the
guide's commands as written (docs/YOUR_MODEL.md), from a directory outside the checkout."""

import json
import os
import subprocess
import sys

import pytest

from tests.docs.markdown import command
from tests.tiny_runs import ROOT, finish, mpirun

GUIDE = "docs/YOUR_MODEL.md"
CONFIG = ROOT / "examples" / "classifier" / "classifier.yaml"
sys.path.insert(0, str(ROOT / "scripts"))

import train  # noqa: E402


def as_written(starts: str, cwd) -> tuple[dict, list[str]]:
    """(environment, argv) of the guide's command line starting `starts`, $JAXRING being the checkout."""
    words = [word.replace("$JAXRING", str(ROOT)) for word in command(GUIDE, starts)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "XLA_FLAGS"))}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "python"
    return {**env, "JAX_PLATFORMS": "cpu"}, [sys.executable, *words[1:]]


def run_as_written(starts: str, cwd) -> str:
    """The output of the guide's command line starting `starts`, run in `cwd`; it must succeed."""
    env, argv = as_written(starts, cwd)
    finished = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return finished.stdout


def summary_of(cwd) -> dict:
    return json.loads((cwd / "runs" / "classifier" / "summary.json").read_text())


def run_lines(rows_file) -> list[dict]:
    return [json.loads(line) for line in rows_file.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The guide's first command, from a folder outside the checkout: (that folder, the output)."""
    cwd = tmp_path_factory.mktemp("mine")
    return cwd, run_as_written("PYTHONPATH=$JAXRING/examples python $JAXRING/scripts/train.py --config", cwd)


def test_the_classifier_learns_from_outside_the_checkout(trained):
    cwd, output = trained
    summary = summary_of(cwd)  # in the default run directory
    assert summary["local_devices"] == 2 and summary["test_error_rate"] < 0.1, summary  # chance: 75%
    rows = run_lines(cwd / "runs" / "classifier" / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"] / 3
    assert " classifier: 3276 train examples, 410 dev examples, 410 test examples" in output  # the task's log line
    assert "Deep Speech" not in output and "speech" not in output
    assert {p.name for p in (cwd / "runs" / "classifier" / "plots").iterdir()} == {"loss.png", "dev_metrics.png"}


def test_resume_goes_on_where_the_run_stopped(trained):
    cwd, _ = trained
    run_as_written("PYTHONPATH=$JAXRING/examples python $JAXRING/scripts/train.py --workdir", cwd)
    summary = summary_of(cwd)
    assert summary["resumed_at_step"] == 102 and summary["steps"] == 153 and summary["test_error_rate"] < 0.1
    assert [row["step"] for row in run_lines(cwd / "runs" / "classifier" / "metrics.jsonl")][-1] == 153


def test_evaluate_scores_the_best_checkpoint_as_training_did(trained):
    """After the resume: test was scored on the best checkpoint, which evaluate.py reads."""
    cwd, _ = trained
    starts = "PYTHONPATH=$JAXRING/examples python $JAXRING/scripts/evaluate.py"
    result = json.loads(run_as_written(starts, cwd))
    summary = summary_of(cwd)
    assert result == {"split": "test", "error_rate": summary["test_error_rate"], "step": summary["test_step"]}
    env, argv = as_written(starts, cwd)
    refused = subprocess.run([*argv, "--beam-width", "4"], cwd=cwd, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "unrecognized arguments: --beam-width 4" in refused.stderr  # Deep Speech 2's


def test_ring_and_lax_train_the_classifier_alike(tmp_path, monkeypatch):
    """In this process (8 devices): the same run with jaxring's ring and with lax's pmean."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    runs = {}
    for allreduce in ("ring", "psum"):
        train.main(["--config", str(CONFIG), "--workdir", allreduce, "--allreduce", allreduce,
                    "--set", "train.epochs=1", "--set", "train.log_every=1"])
        runs[allreduce] = [row["loss"] for row in run_lines(tmp_path / allreduce / "metrics.jsonl")]
    assert len(runs["ring"]) == 51 and runs["ring"][-1] < runs["ring"][0] / 2
    assert runs["ring"] == pytest.approx(runs["psum"], rel=1e-5)


def test_two_processes_under_mpirun(tmp_path, monkeypatch):
    """The guide's mpirun line, from a folder outside the checkout: one device per process."""
    words = [word.replace("$JAXRING", str(ROOT)) for word in command(GUIDE, "PYTHONPATH=$JAXRING/examples mpirun")]
    assert words[1:7] == ["mpirun", "-np", "2", "python", "-m", "mpi4py"]  # what mpirun(2, ..., with_mpi4py) runs
    monkeypatch.chdir(tmp_path)  # mpirun's processes start here
    code, output = finish(mpirun(2, words[7:], env={"PYTHONPATH": str(ROOT / "examples")}, with_mpi4py=True,
                                 devices_per_proc=1), timeout_s=200)
    assert code == 0, output
    workdir = tmp_path / words[words.index("--workdir") + 1]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["test_error_rate"] < 0.1, summary
    assert output.count(" classifier: 3276 train examples") == 1  # the lead process's console only


def test_the_guide_shows_the_examples_config_as_it_is():
    from tests.docs.markdown import blocks

    assert blocks(GUIDE, "yaml") == [CONFIG.read_text()]
