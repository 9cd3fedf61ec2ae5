"""jaxring-train and jaxring-evaluate, the commands an installed jaxring has: a task of one's own trained and
scored from a folder outside the checkout, with neither scripts/ nor models/ on the Python path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = Path(sys.executable).parent  # where pip put the console scripts of pyproject.toml


def run_command(name, args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "XLA_FLAGS"))}
    env.update(PYTHONPATH=str(Path(__file__).parent), JAX_PLATFORMS="cpu")  # toy_task.py's folder alone
    return subprocess.run([str(COMMANDS / name), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_installed_commands_train_and_score_a_task_of_ones_own(tmp_path):
    (tmp_path / "toy.yaml").write_text("task: toy_task:ToyTask\ntrain: {batch_size: 8, epochs: 1, log_every: 4}\n"
                                       "eval: {every_steps: 6, batch_size: 16}\n")
    trained = run_command("jaxring-train", ["--config", "toy.yaml", "--host-devices", "2"], tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.rstrip().endswith("; run directory runs/toy")
    summary = json.loads((tmp_path / "runs" / "toy" / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["local_devices"] == 2 and "test_mse" in summary
    scored = run_command("jaxring-evaluate", ["--workdir", "runs/toy", "--split", "test"], tmp_path)
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout.splitlines()[-1])
    assert result == {"split": "test", "mse": pytest.approx(summary["test_mse"], rel=1e-5), "step": summary["test_step"]}


def test_an_error_the_engine_explains_is_one_line_and_exit_status_1(tmp_path):
    (tmp_path / "toy.yaml").write_text("task: toy_task:ToyTask\noptim: {lr: 0.1}\n")
    failed = run_command("jaxring-train", ["--config", "toy.yaml"], tmp_path)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1].startswith("error: toy.yaml: unknown key 'lr' in optim")
