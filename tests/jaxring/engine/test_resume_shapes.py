"""Resuming on another shape (processes x local devices): a run trained on 2 x 2 goes on on 1 x 4, 1 x 2 and
4 x 1 with the same global batch, data order and schedule, and says so in one line; what cannot go on so is
refused, naming what to pass. The reference is the same run trained straight through on 2 x 2."""

import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxring.engine import launch
from jaxring.engine import trainer as trainer_lib
from jaxring.engine.checkpoint import Checkpoints
from jaxring.engine.rundir import RunDirectoryError
from tests.jaxring.engine.toy_task import SHAPE_CONFIG, ToyBatches, ToyTask, toy_config, world_of
from tests.tiny_runs import finish, mpirun

WORKER = Path(__file__).with_name("shape_worker.py")
RESUMED_AT = 10  # mid-epoch (12 steps an epoch): the resume crosses the epoch boundary at 12
STEPS = 24


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The run trained straight through on 2 processes x 2 local devices, checkpoints every 5 steps kept."""
    workdir = tmp_path_factory.mktemp("shapes") / "straight"
    code, output = finish(mpirun(2, [WORKER, workdir], with_mpi4py=True, devices_per_proc=2), 300)
    assert code == 0, output
    assert "2 local cpu devices x 2 processes, global batch 8 (2 per device)" in output
    return workdir


def stopped_at(straight: Path, workdir: Path, step: int = RESUMED_AT) -> Path:
    """A copy of the straight run as if it had stopped after its checkpoint of `step`."""
    shutil.copytree(straight, workdir)
    checkpoints = Checkpoints(workdir / "checkpoints")
    for later in [s for s in checkpoints.steps() if s > step]:
        checkpoints.path(later).unlink()
    (workdir / "summary.json").unlink()
    (workdir / "checkpoints" / "best.json").unlink(missing_ok=True)
    return workdir


def final_state(workdir: Path):
    template = trainer_lib.Trainer(ToyTask(), toy_config(**SHAPE_CONFIG), workdir / "t", world_of(1)).init_state()
    state, _ = Checkpoints(workdir / "checkpoints").restore(template)
    return state


def rows(workdir: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())}


def assert_goes_on_as_the_straight_run(straight: Path, resumed: Path):
    a, b = final_state(straight), final_state(resumed)
    assert int(a.step) == int(b.step) == STEPS
    # Another data order or schedule moves the weights by far more than the replicas' summation order does.
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)
    before, after = rows(straight), rows(resumed)
    assert sorted(after) == sorted(before)  # every row once, none lost at the resume
    for step in [step for step in before if step > RESUMED_AT]:
        if "learning_rate" in before[step]:
            assert after[step]["learning_rate"] == before[step]["learning_rate"], step
            assert after[step]["loss"] == pytest.approx(before[step]["loss"], rel=1e-4), step


SAID = re.compile(r"resuming step 10 on (\d) x (\d) cpu \(processes x local devices; trained on 2 x 2 cpu\): "
                  r"the same global batch 8 \((\d) per device\), data order and learning-rate schedule")


@pytest.mark.parametrize("local_devices", [4, 2], ids=["1x4", "1x2"])
def test_a_2x2_run_goes_on_on_one_process(straight, tmp_path, capsys, local_devices):
    resumed = stopped_at(straight, tmp_path / "run")
    trainer_lib.Trainer(ToyTask(), toy_config(**SHAPE_CONFIG), resumed, world_of(local_devices)).fit(resume=True)
    said = [line for line in capsys.readouterr().out.splitlines() if "trained on 2 x 2" in line]
    assert len(said) == 1 and SAID.search(said[0]).groups() == ("1", str(local_devices), str(8 // local_devices))
    assert_goes_on_as_the_straight_run(straight, resumed)


def test_a_2x2_run_goes_on_on_four_processes_of_one_device(straight, tmp_path):
    resumed = stopped_at(straight, tmp_path / "run")
    code, output = finish(mpirun(4, [WORKER, resumed, "--resume"], with_mpi4py=True, devices_per_proc=1), 300)
    assert code == 0, output
    assert SAID.search(output).groups() == ("4", "1", "2"), output
    assert_goes_on_as_the_straight_run(straight, resumed)


class _ProcessOrderedBatches(ToyBatches):
    global_order = False  # as a loader whose order depends on the process count would say


class _ProcessOrderedTask(ToyTask):
    def train_batches(self, batch_size, shard, seed):
        return _ProcessOrderedBatches(self.x, self.y, batch_size, shard, seed)


def test_a_new_process_count_is_refused_where_the_batches_cannot_keep_their_order(straight, tmp_path):
    resumed = stopped_at(straight, tmp_path / "run")
    trainer = trainer_lib.Trainer(_ProcessOrderedTask(), toy_config(**SHAPE_CONFIG), resumed, world_of(4))
    with pytest.raises(RunDirectoryError, match=r"trained on 2 processes and this run has 1; the task's training "
                       r"batches \(.*_ProcessOrderedBatches\) do not set global_order.*mpirun -np 2"):
        trainer.fit(resume=True)
    assert Checkpoints(resumed / "checkpoints").steps()[-1] == RESUMED_AT  # nothing trained, nothing written


def test_a_global_batch_that_does_not_split_over_the_new_replicas_names_what_to_pass(straight, tmp_path):
    resumed = stopped_at(straight, tmp_path / "run")
    with pytest.raises(ValueError, match=r"train.batch_size 8 must be a multiple of the 3 replicas .*--host-devices N"
                       r".*--set train.batch_size=M with M a multiple of 3"):
        trainer_lib.Trainer(ToyTask(), toy_config(**SHAPE_CONFIG), resumed, world_of(3))


def test_a_resume_without_host_devices_splits_the_cpu_as_the_checkpoint_did(straight, tmp_path, monkeypatch, capsys):
    resumed = stopped_at(straight, tmp_path / "run")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")  # no device count: the flag's absence
    assert launch.resumed_host_devices(resumed) == 2
    assert "--resume: the run trained on 2 CPU devices per process: --host-devices 2 again" in capsys.readouterr().out
    assert launch.resumed_host_devices(tmp_path / "no run") is None  # a fresh --resume: nothing recorded
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert launch.resumed_host_devices(resumed) is None  # the environment chose: the resume says what changed
