"""The engine on a toy task: replica equivalence, determinism, the run directory, resume after SIGKILL."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.engine import config as config_lib
from jaxring.engine import precision
from jaxring.engine import trainer as trainer_lib
from jaxring.engine.checkpoint import CheckpointError, Checkpoints
from jaxring.engine.devices import replicate, split_for_devices
from jaxring.engine.task import AXIS, MetricNames
from tests.jaxring.engine.toy_task import (SEPARATE_DISKS_CONFIG, SPLITS, ToyTask, ring_available, toy_config,
                                           world_of)
from tests.tiny_runs import finish, mpirun


def numpy_mse(task, params, split):
    """The mean squared error of `params` on `split`, in float64 numpy: the reference for the engine's."""
    p = {k: np.float64(v) for k, v in params.items()}
    x, y = task.x[SPLITS[split]].astype(np.float64), task.y[SPLITS[split]].astype(np.float64)
    return np.mean((np.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)


def train_params(tmp_path, n_devices, task=None, **sections):
    trainer = trainer_lib.Trainer(task or ToyTask(), toy_config(**sections), tmp_path, world_of(n_devices))
    summary = trainer.fit()
    state, _ = trainer.checkpoints.restore(trainer.init_state())
    return state, summary


@pytest.mark.parametrize(
    "allreduce",
    ["psum", pytest.param("ring", marks=pytest.mark.skipif(not ring_available(), reason="jaxring ring not built"))],
)
@pytest.mark.parametrize("n_devices", [2, 8])
def test_replicas_match_one_device_with_the_whole_batch(tmp_path, allreduce, n_devices):
    one, _ = train_params(tmp_path / "one", 1, train={"allreduce": allreduce})
    many, _ = train_params(tmp_path / "many", n_devices, train={"allreduce": allreduce})
    assert int(many.step) == int(one.step) == 96 // 8
    for a, b in zip(jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(many)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_same_seed_same_result_and_another_seed_differs(tmp_path):
    a, _ = train_params(tmp_path / "a", 4)
    b, _ = train_params(tmp_path / "b", 4)
    c, _ = train_params(tmp_path / "c", 4, train={"seed": 1})
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.params["w1"], c.params["w1"])


class ReportingTask(ToyTask):
    """ToyTask with the optional data check of the Task contract."""

    def check_data(self):
        return {"train": {"summary": "96 rows, none dropped", "rows": 96}}


def test_run_directory(tmp_path, capsys):
    sections = {"train": {"epochs": 2}, "optim": {"schedule": "anneal", "anneal_factor": 2.0}}  # 12 steps an epoch
    state, summary = train_params(tmp_path, 4, task=ReportingTask(), **sections)
    assert json.loads((tmp_path / "data_report.json").read_text()) == ReportingTask().check_data()
    data_lines = [line for line in capsys.readouterr().out.splitlines() if line.endswith(" data 96 rows, none dropped")]
    assert len(data_lines) == 1 and TIMESTAMP.match(data_lines[0])  # the report's summary is shown, as a status line
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(2, 25, 2))
    # each row's rate is the one its step used: halved after step 12
    np.testing.assert_allclose([r["learning_rate"] for r in rows], [0.05 / 2 ** ((r["step"] - 1) // 12) for r in rows])
    assert all({"loss", "examples_per_s", "allreduce_share_estimate", "learning_rate"} <= r.keys() for r in rows)
    assert "dev_mse" in rows[2] and "dev_mse" in rows[-1]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(0 <= r["allreduce_share_estimate"] <= 1 for r in rows)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["steps"] == 24 and on_disk["dev_mse"] == rows[-1]["dev_mse"] and on_disk["loss"] == rows[-1]["loss"]
    assert on_disk["bucket_bytes"] == 256 << 10  # no train.bucket_bytes in the config: the CPU's default
    assert on_disk["last_window_allreduce_share_estimate"] == rows[-1]["allreduce_share_estimate"]
    dev_rows = [r for r in rows if "dev_mse" in r]
    assert [r["step"] for r in dev_rows] == [6, 12, 18, 24]
    assert on_disk["best_step"] == on_disk["test_step"] == min(dev_rows, key=lambda r: r["dev_mse"])["step"]
    best_weights = Checkpoints(tmp_path / "checkpoints").read(on_disk["best_step"]).state["params"]
    np.testing.assert_allclose(on_disk["test_mse"], numpy_mse(ToyTask(), best_weights, "test"), rtol=1e-5)
    assert config_lib.load(tmp_path / "config.yaml", {}).to_dict() == toy_config(**sections).to_dict()
    assert (tmp_path / "plots" / "loss.png").stat().st_size > 0 and (tmp_path / "plots" / "dev_metrics.png").exists()
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert best["metric"] == "mse" and best["value"] == min(r["dev_mse"] for r in rows if "dev_mse" in r)
    assert any((tmp_path / "tensorboard").iterdir())
    # dev evaluation in the engine equals a float64 numpy evaluation of the final weights
    np.testing.assert_allclose(summary["dev_mse"], numpy_mse(ToyTask(), state.params, "dev"), rtol=1e-5)


class EarliestBestTask(ToyTask):
    """ToyTask whose best metric, the negated mse, makes the first dev evaluation the best: never the final step."""

    metrics = MetricNames(best="negated_mse", plotted=("mse",), shown=("mse",), label="dev mse")

    def summarize(self, counts):
        mse = super().summarize(counts)["mse"]
        return {"mse": mse, "negated_mse": -mse}


def test_test_is_scored_on_the_best_checkpoint_not_the_final_state(tmp_path):
    final, summary = train_params(tmp_path, 2, task=EarliestBestTask(), train={"epochs": 2})
    assert summary["best_step"] == summary["test_step"] == 6 and int(final.step) == 24
    best = Checkpoints(tmp_path / "checkpoints").read(6).state["params"]
    task = ToyTask()
    np.testing.assert_allclose(summary["test_mse"], numpy_mse(task, best, "test"), rtol=1e-5)
    assert abs(numpy_mse(task, best, "test") - numpy_mse(task, final.params, "test")) > 1e-3  # the two differ


def test_a_damaged_best_checkpoint_is_not_reported_as_the_step_test_was_scored_on(tmp_path, monkeypatch, capsys):
    save = Checkpoints.save

    def save_then_damage_step_6(self, step, *args, **kwargs):
        path = save(self, step, *args, **kwargs)
        if step == 24:  # the final save: the best checkpoint, step 6, is damaged on disk before test is scored
            self.path(6).write_bytes(self.path(6).read_bytes()[:-50])
        return path

    monkeypatch.setattr(Checkpoints, "save", save_then_damage_step_6)
    final, summary = train_params(tmp_path, 2, task=EarliestBestTask(), train={"epochs": 2})
    assert summary["best_step"] == 6 and summary["test_step"] == 24  # the newest intact one, said so
    assert json.loads((tmp_path / "summary.json").read_text())["test_step"] == 24
    np.testing.assert_allclose(summary["test_mse"], numpy_mse(ToyTask(), final.params, "test"), rtol=1e-5)
    assert f"checkpoint {tmp_path / 'checkpoints' / 'step_000000006.msgpack'} is damaged" in capsys.readouterr().err


def test_a_best_metric_the_task_does_not_report_is_refused_before_step_1(tmp_path):
    config = toy_config(checkpoint={"best_metric": "mes"})
    with pytest.raises(config_lib.ConfigError, match=r"checkpoint.best_metric 'mes' is not a metric of the task; "
                       r"did you mean 'mse'\? \(its metrics: mse\)"):
        trainer_lib.Trainer(ToyTask(), config, tmp_path, world_of(1))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_master_weights_stay_float32_under_bfloat16_compute(tmp_path):
    state, summary = train_params(tmp_path, 2, task=ToyTask(compute_dtype=jnp.bfloat16))
    assert all(leaf.dtype == np.float32 for leaf in jax.tree_util.tree_leaves(state.params))
    assert np.isfinite(summary["loss"])


class NoisyTask(ToyTask):
    """ToyTask whose loss is a draw from the step's rng: each replica's loss shows which rng it got."""

    def loss(self, variables, batch, rng):
        _, model_state = super().loss(variables, batch, rng)
        return jax.random.uniform(rng), model_state


def test_every_replica_of_every_process_draws_its_own_rng(tmp_path):
    n_local, draws = 2, []
    batch = split_for_devices({"x": ToyTask().x[:8], "y": ToyTask().y[:8]}, n_local)
    for rank in (0, 1):  # process `rank` of a run of two, each with n_local devices (the step itself is local)
        world = SimpleNamespace(rank=rank, size=1, local_devices=jax.local_devices()[:n_local])
        trainer = trainer_lib.Trainer(NoisyTask(), toy_config(), tmp_path / str(rank), world)
        state = replicate(trainer.init_state(), world.local_devices)
        _, _, losses = jax.pmap(trainer.step_parts.local, axis_name=AXIS)(state, batch)
        draws += np.asarray(losses).tolist()
    assert len(set(draws)) == 2 * n_local, draws  # dropout-like noise must not repeat across replicas


def test_batch_not_divisible_by_replicas_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="multiple of the 3 replicas"):
        trainer_lib.Trainer(ToyTask(), toy_config(), tmp_path, world_of(3))


class RaggedBatches(list):
    """A loader that yields what the test gives it, in order (and then the first batch again)."""

    steps_per_epoch = 3

    def state(self):
        return {}

    def restore(self, state):
        pass


def _ragged(rows_per_step, columns=5):
    rng = np.random.default_rng(0)
    return RaggedBatches({"x": rng.normal(size=(rows, columns)).astype(np.float32),
                          "y": rng.normal(size=(rows, 1)).astype(np.float32)} for rows in rows_per_step)


def test_a_batch_that_does_not_split_names_the_step_and_the_loader_not_the_config(tmp_path):
    batches = _ragged([8, 8, 7])
    trainer = trainer_lib.Trainer(ToyTask(), toy_config(train={"max_steps": 3}), tmp_path, world_of(2), batches)
    with pytest.raises(ValueError) as error:
        trainer.fit()
    assert str(error.value) == (
        f"step 3: the task's training batches ({RaggedBatches.__module__}.RaggedBatches) yielded ['x'] "
        "float32[7, 5], ['y'] float32[7, 1], where the step takes 8 rows per process (train.batch_size 8 over "
        "1 process): 7 rows do not split evenly over 2 local devices. The loader is at fault: make it yield 8 "
        "rows per batch.")


def test_a_batch_of_another_size_is_warned_about_once_or_refused(tmp_path):
    config = toy_config(train={"max_steps": 3, "log_every": 1})
    with pytest.warns(UserWarning) as warned:
        trainer_lib.Trainer(ToyTask(), config, tmp_path / "warn", world_of(2), _ragged([8, 6, 4])).fit()
    messages = [str(w.message) for w in warned if "training batches" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("step 2: ") and "compiles again" in messages[0], messages
    refusing = toy_config(train={"max_steps": 3, "off_size_batches": "refuse"})
    trainer = trainer_lib.Trainer(ToyTask(), refusing, tmp_path / "refuse", world_of(2), _ragged([8, 6, 8]))
    with pytest.raises(ValueError, match=r"^step 2: .* and train.off_size_batches is 'refuse'"):
        trainer.fit()


_RUN = """
import sys
sys.path.insert(0, {tests!r})
from toy_task import ToyTask, toy_config, world_of
from jaxring.engine.trainer import Trainer
cfg = toy_config(train={{"epochs": 4}}, checkpoint={{"every_steps": 4}}, eval={{"every_steps": 0}})
Trainer(ToyTask(delay={delay}), cfg, {workdir!r}, world_of(4)).fit(resume={resume})
"""


def _run_toy(workdir, resume, delay):
    code = _RUN.format(tests=str(Path(__file__).parent), workdir=str(workdir), resume=resume, delay=delay)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ)


def test_resume_after_sigkill_ends_bitwise_equal(tmp_path):
    straight = _run_toy(tmp_path / "straight", False, 0.0)
    killed_dir = tmp_path / "killed"
    killed = _run_toy(killed_dir, False, 0.3)
    deadline = time.time() + 120
    while not (killed_dir / "checkpoints" / "step_000000008.msgpack").exists():
        assert killed.poll() is None, killed.stdout.read().decode()
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert straight.wait() == 0, straight.stdout.read().decode()
    resumed = _run_toy(killed_dir, True, 0.0)
    output = resumed.communicate()[0].decode()
    assert resumed.returncode == 0, output
    assert "resuming at step" in output
    task = ToyTask()
    template = trainer_lib.Trainer(task, toy_config(train={"epochs": 4}), tmp_path / "t", world_of(4)).init_state()
    a, _ = Checkpoints(tmp_path / "straight" / "checkpoints").restore(template)
    b, _ = Checkpoints(killed_dir / "checkpoints").restore(template)
    assert int(a.step) == int(b.step) == 48
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    steps = [json.loads(line)["step"] for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # the rows after the checkpoint were not written twice


TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def test_logs_off_a_terminal_are_timestamped_lines_with_status_lines(tmp_path, capsys):
    train_params(tmp_path, 2, train={"epochs": 2}, checkpoint={"every_steps": 4})  # 24 steps, a row every 2, dev every 6
    out, err = capsys.readouterr()
    assert "\r" not in out + err  # no progress bar: stdout is captured, not a terminal
    lines = out.splitlines()
    assert lines and all(TIMESTAMP.match(line) for line in lines), out
    step_lines = [line for line in lines if re.search(r" step \d+/24 loss ", line)]
    assert [int(re.search(r"step (\d+)/", line)[1]) for line in step_lines] == list(range(2, 25, 2))
    assert "dev_mse " in step_lines[-1] and "ex/s " in step_lines[-1]  # the last dev metric and the pace
    assert "global batch 8 (4 per device)" in out
    text = "\n".join(lines)
    assert text.count("compiling the training step") == 1 and "first step compiled and run in" in text
    assert text.count("evaluating dev") == 4 and text.count("evaluating test") == 1  # steps 6, 12, 18, 24
    # mse is not a rate (MetricNames.percent): printed as it is, never as a percentage
    assert re.search(r"dev: mse \d+\.\d+ \(\d+\.\d s\)", text) and re.search(r"test: mse \d+\.\d+ \(", text)
    assert not re.search(r"mse \S+%", text), text
    # at every dev evaluation (with its metrics) and every checkpoint.every_steps between them
    assert [int(s) for s in re.findall(r"saved the checkpoint of step (\d+)", text)] == [4, 6, 8, 12, 16, 18, 20, 24]
    assert text.index("compiling") < text.index("step 2/24") < text.index("evaluating dev")


def test_summary_throughput_is_the_whole_training_loop_and_since_the_resume(tmp_path):
    delay = 0.05  # per batch: the loop takes at least steps x delay
    workdir = tmp_path / "runs" / "run"  # the run directory and its parent are made
    started = time.perf_counter()
    first = trainer_lib.Trainer(ToyTask(delay=delay), toy_config(train={"max_steps": 6}), workdir, world_of(2)).fit()
    first_wall = time.perf_counter() - started
    assert first["examples"] == 6 * 8 and 6 * delay <= first["train_seconds"] < first_wall
    assert first["examples_per_s"] == pytest.approx(first["examples"] / first["train_seconds"])
    assert "resumed_at_step" not in first and first["last_window_examples_per_s"] > 0
    assert json.loads((workdir / "summary.json").read_text())["examples_per_s"] == first["examples_per_s"]

    resumed = trainer_lib.Trainer(ToyTask(delay=delay), toy_config(), workdir, world_of(2)).fit(resume=True)
    assert resumed["resumed_at_step"] == 6 and resumed["steps"] == 12
    assert resumed["examples_since_resume"] == 6 * 8 and resumed["examples"] == 12 * 8
    assert resumed["train_seconds_since_resume"] >= 6 * delay
    assert resumed["train_seconds"] == pytest.approx(first["train_seconds"] + resumed["train_seconds_since_resume"])
    assert resumed["examples_per_s"] == pytest.approx(96 / resumed["train_seconds"])
    assert resumed["examples_per_s_since_resume"] == pytest.approx(48 / resumed["train_seconds_since_resume"])


def test_processes_with_separate_disks_resume_from_process_0s_checkpoint(tmp_path):
    """Only process 0 reads checkpoints and broadcasts them: a process whose disk has none resumes all the same."""
    first = toy_config(**{**SEPARATE_DISKS_CONFIG, "train": {"epochs": 2, "max_steps": 12}})
    trainer_lib.Trainer(ToyTask(), first, tmp_path / "rank0", world_of(4)).fit()  # on process 0's disk only
    (tmp_path / "rank1").mkdir()  # process 1's disk: no checkpoint
    worker = Path(__file__).with_name("separate_disks_worker.py")
    code, output = finish(mpirun(2, [worker, tmp_path], with_mpi4py=True, devices_per_proc=2), 300)
    assert code == 0, output
    for rank in (0, 1):  # both resumed at process 0's step and scored test on the same best step
        assert re.search(rf"rank {rank} resumed_at_step 12 steps 24 test_step (6|12|18|24)\n", output), output
    assert len(set(re.findall(r"test_step (\d+)", output))) == 1, output
    assert not (tmp_path / "rank1" / "checkpoints").exists()  # only process 0 writes
    straight, _ = train_params(tmp_path / "straight", 4, **SEPARATE_DISKS_CONFIG)
    template = trainer_lib.Trainer(ToyTask(), toy_config(), tmp_path / "t", world_of(4)).init_state()
    resumed, _ = Checkpoints(tmp_path / "rank0" / "checkpoints").restore(template)
    assert int(resumed.step) == int(straight.step) == 24
    for a, b in zip(jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_a_run_that_never_logs_queues_its_steps_and_ends_bitwise_equal(tmp_path):
    """log_every past the run's end and no evaluation or checkpoint before it: nothing
    reads a value, so only the trainer's window (STEPS_IN_FLIGHT) paces the queue,
    over 8 devices and more steps than XLA's CPU client keeps in flight."""
    steps = {"epochs": 8}  # 96 steps
    quiet, _ = train_params(tmp_path / "quiet", 8, train={**steps, "log_every": 10_000},
                            eval={"every_steps": 0}, checkpoint={"every_steps": 0})
    logged, _ = train_params(tmp_path / "logged", 8, train=steps)
    assert int(quiet.step) == int(logged.step) == 96 > 2 * trainer_lib.STEPS_IN_FLIGHT
    for a, b in zip(jax.tree_util.tree_leaves(quiet), jax.tree_util.tree_leaves(logged)):
        np.testing.assert_array_equal(a, b)


def test_accumulated_micro_batches_make_the_updates_of_the_whole_batch(tmp_path):
    # The same 16 examples per update, in one batch or in 4 micro-batches per device: the same updates,
    # up to float32 summation order.
    whole, _ = train_params(tmp_path / "whole", 2, train={"batch_size": 16, "epochs": 2})
    micro, _ = train_params(tmp_path / "micro", 2, train={"batch_size": 16, "epochs": 2, "accumulate_steps": 4})
    for a, b in zip(jax.tree_util.tree_leaves(whole.params), jax.tree_util.tree_leaves(micro.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6)
    with pytest.raises(ValueError, match="train.accumulate_steps 3 does not split evenly: make train.batch_size "
                                         "a multiple of 6"):
        trainer_lib.Trainer(ToyTask(), toy_config(train={"accumulate_steps": 3}), tmp_path / "odd", world_of(2))


@pytest.mark.parametrize("compute_dtype, tolerance", [("bfloat16", 0.05), ("float16", 0.01)])
def test_lower_precision_compute_keeps_float32_weights_and_trains_as_float32_does(tmp_path, compute_dtype, tolerance):
    reference, reference_summary = train_params(tmp_path / "f32", 2, train={"epochs": 2})
    state, summary = train_params(tmp_path / compute_dtype, 2, train={"epochs": 2, "compute_dtype": compute_dtype})
    assert all(leaf.dtype == np.float32 for leaf in jax.tree_util.tree_leaves(state.params))
    assert all(leaf.dtype == np.float32 for leaf in jax.tree_util.tree_leaves(state.model_state))
    assert abs(summary["loss"] - reference_summary["loss"]) <= tolerance * reference_summary["loss"], (
        summary["loss"], reference_summary["loss"])
    if compute_dtype == "float16":
        assert float(np.asarray(state.loss_scale.scale)) == precision.INITIAL_SCALE  # no overflow in this run


def test_loss_scale_halves_on_overflow_and_doubles_after_a_run_of_good_steps():
    scale = precision.LossScale.initial()
    after_overflow = scale.after(jnp.asarray(False))
    assert float(after_overflow.scale) == precision.INITIAL_SCALE / 2 and int(after_overflow.good_steps) == 0
    steady = scale
    for _ in range(precision.GROWTH_INTERVAL - 1):
        steady = steady.after(jnp.asarray(True))
    assert float(steady.scale) == precision.INITIAL_SCALE and int(steady.good_steps) == precision.GROWTH_INTERVAL - 1
    grown = steady.after(jnp.asarray(True))
    assert float(grown.scale) == 2 * precision.INITIAL_SCALE and int(grown.good_steps) == 0
    floor = precision.LossScale(jnp.asarray(1.0), jnp.asarray(5, jnp.int32)).after(jnp.asarray(False))
    assert float(floor.scale) == 1.0


class OverflowingTask(ToyTask):
    """ToyTask whose loss is huge at the first step only: under float16's scale, that step's gradients overflow."""

    def loss(self, variables, batch, rng):
        loss, model_state = super().loss(variables, batch, rng)
        return loss * jnp.where(variables["stats"]["mean"][0] == 0, 1e6, 1.0).astype(loss.dtype), model_state


def test_a_float16_step_whose_gradients_overflow_is_skipped_and_the_scale_halved(tmp_path):
    config = toy_config(train={"max_steps": 1, "compute_dtype": "float16"})
    trainer = trainer_lib.Trainer(OverflowingTask(), config, tmp_path, world_of(2))
    state = replicate(trainer.init_state(), trainer.devices)
    before = np.asarray(state.params["w1"]).copy()  # the step donates `state`
    after, _ = trainer.train_step(state, next(iter(trainer.batches)))
    np.testing.assert_array_equal(np.asarray(after.params["w1"]), before)
    assert float(np.asarray(after.loss_scale.scale)[0]) == precision.INITIAL_SCALE / 2


def test_training_a_finished_run_longer_keeps_its_last_rate_and_says_so(tmp_path, capsys):
    optim = {"schedule": "warmup_cosine", "warmup_steps": 3, "final_learning_rate": 0.001}
    trainer_lib.Trainer(ToyTask(), toy_config(train={"max_steps": 12}, optim=optim), tmp_path, world_of(2)).fit()
    longer = toy_config(train={"max_steps": 20}, optim=optim)
    trainer_lib.Trainer(ToyTask(), longer, tmp_path, world_of(2)).fit(resume=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rates = {row["step"]: row["learning_rate"] for row in rows if "learning_rate" in row}
    after = [rate for step, rate in rates.items() if step > 12]  # step 12's row shows the rate step 12 ran at
    assert after and all(rate == pytest.approx(0.001, rel=1e-5) for rate in after) and rates[12] > 0.001
    assert "the run's length changed from 12 to 20 steps: the learning rate goes on from step 12's" in capsys.readouterr().out


def test_a_checkpoint_without_what_a_resume_reads_is_refused_naming_it(tmp_path):
    config = toy_config(train={"max_steps": 4}, eval={"every_steps": 0}, checkpoint={"every_steps": 2})
    trainer_lib.Trainer(ToyTask(), config, tmp_path, world_of(2)).fit()
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    state, extra, step = checkpoints.read(4)
    del extra[trainer_lib.THROUGHPUT_KEY], extra[trainer_lib.SCHEDULE_PLAN_KEY]
    checkpoints.save(step, state, extra)
    longer = toy_config(train={"max_steps": 6}, eval={"every_steps": 0}, checkpoint={"every_steps": 2})
    with pytest.raises(CheckpointError, match=r"^the checkpoint of step 4 in .* has no throughput, schedule_plan record: "
                                              r".* start the run over with --overwrite$"):
        trainer_lib.Trainer(ToyTask(), longer, tmp_path, world_of(2)).fit(resume=True)
