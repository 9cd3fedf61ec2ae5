"""How long a run trains: train.max_steps is its length, and --resume of a finished run says so."""

import json

import pytest

from jaxring.engine import rundir
from jaxring.engine import trainer as trainer_lib
from tests.jaxring.engine.toy_task import ToyTask, toy_config, world_of


def test_max_steps_is_the_length_even_past_the_epochs_and_a_finished_run_is_not_repeated(tmp_path):
    workdir = tmp_path / "run"
    config = toy_config(train={"max_steps": 15}, eval={"every_steps": 0})  # 1 epoch is 12 steps of 8 rows
    summary = trainer_lib.Trainer(ToyTask(), config, workdir, world_of(2)).fit()
    assert summary["steps"] == 15 and summary["epochs"] == pytest.approx(15 / 12)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 15
    with pytest.raises(rundir.RunFinished, match=r"is finished: it trained 15 steps .*--resume --set train\.max_steps=30"):
        trainer_lib.Trainer(ToyTask(), config, workdir, world_of(2)).fit(resume=True)
    assert json.loads((workdir / "summary.json").read_text()) == json.loads(json.dumps(summary))  # untouched
    longer = toy_config(train={"max_steps": 18}, eval={"every_steps": 0})
    resumed = trainer_lib.Trainer(ToyTask(), longer, workdir, world_of(2)).fit(resume=True)
    assert resumed["resumed_at_step"] == 15 and resumed["steps"] == 18


def test_a_run_stopped_before_its_summary_resumes(tmp_path):
    rundir.refuse_finished(tmp_path, 15, 15)  # no summary.json: the end is still to do
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 10}))
    rundir.refuse_finished(tmp_path, 15, 15)  # the summary of an earlier, shorter length
    rundir.refuse_finished(tmp_path, 10, 15)  # a longer length: training continues
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 15}))
    with pytest.raises(rundir.RunFinished):
        rundir.refuse_finished(tmp_path, 15, 15)
