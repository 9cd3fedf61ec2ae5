"""The synchronous data-parallel SGD engine: model-agnostic, pmapped, jaxring all-reduce.

A model comes in as a `Task` (jaxring/engine/task.py); the Trainer runs the
loop and keeps the run's books: splitting the global batch over processes and
local devices, the optimizer's schedule, evaluation, checkpoints and what the
run writes to its directory. The step itself is jaxring/engine/step.py's, its
gradient all-reduce the `sync` object's (jaxring/engine/sync.py), chosen once
from the world; what the processes exchange on the host is
jaxring/engine/host_exchange.py's.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxring.collectives.fusion import default_bucket_bytes
from jaxring.engine import config as config_lib
from jaxring.engine import metrics as metrics_lib
from jaxring.engine import run_shape, rundir, sharded_step
from jaxring.engine.batch_check import BatchCheck
from jaxring.engine.checkpoint import BEST, LATEST, CheckpointError, Checkpoints
from jaxring.engine.devices import batch_rows, replicate, split_for_devices, split_sources, unreplicate
from jaxring.engine.evaluation import evaluate, make_predict
from jaxring.engine.host_exchange import HostExchange
from jaxring.engine.optim import decay_mask_of, planned_schedule
from jaxring.engine.own_optimizer import optimizer_for
from jaxring.engine.progress import Progress, counted
from jaxring.engine.registry import check_task_class
from jaxring.engine.step import StepParts, TrainState, init_train_state, make_train_step, variables_of
from jaxring.engine.sync_mpi4jax import sync_for
from jaxring.engine.task import Shard, Task

# The most training steps left in flight: JAX queues steps without waiting, and
# each queued step holds its batch and outputs; waiting for the step this far
# back keeps the queue full and that memory bounded (the results do not depend
# on it: docs/USAGE.md, "Steps in flight").
STEPS_IN_FLIGHT = 16
# Timings of the sync alone at start-up, of which the median is kept: the
# all-reduce share of a step is that over the measured step time, with no
# extra collectives in the training loop. The share is the steady state's:
# across processes the first 15-30 calls of the program after it compiled
# ran 10-20 ms in one of three against 2 ms after (ds2_tiny, 2 processes,
# docs/PERFORMANCE.md), so many untimed calls come first.
SYNC_TIMING_WARMUP = 20
SYNC_TIMING_REPEATS = 10

# The key of a checkpoint's extra dict that carries the run's examples and loop seconds across resumes.
THROUGHPUT_KEY = "throughput"
# ... and the run's length at its start and at each resume that changed it (optim.planned_schedule).
SCHEDULE_PLAN_KEY = "schedule_plan"
# What a resume reads of a checkpoint's extra dict: every checkpoint `save` writes holds them.
RESUME_KEYS = ("batches", THROUGHPUT_KEY, SCHEDULE_PLAN_KEY, run_shape.SHAPE_KEY)


def count_params(params) -> int:
    return sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))


@dataclasses.dataclass
class _Window:
    """The steps since the last logged row, over which the row's pace is measured."""

    examples: int = 0
    steps: int = 0
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def add(self, examples: int) -> None:
        self.examples += examples
        self.steps += 1

    def restart(self) -> None:
        self.examples, self.steps, self.started = 0, 0, time.perf_counter()


# ---------------------------------------------------------------- the engine


class Trainer:
    """Trains `task` with `config` in `workdir` on this process's local devices."""

    def __init__(self, task: Task, config: config_lib.Config, workdir: str | Path, world=None, batches=None):
        """`batches`: this process's training Batches (default: the task's, for its shard)."""
        check_task_class(type(task))  # a task built without the registry is held to the same contract
        self.task = task
        self.config = config
        self.workdir = Path(workdir)
        self.world = world
        self.rank = world.rank if world is not None else 0
        self.world_size = world.size if world is not None else 1
        self.devices = list(world.local_devices) if world is not None else jax.local_devices()
        self.n_local = len(self.devices)
        self.exchange = HostExchange(world.comm if self.world_size > 1 else None, self.rank)
        train = config.train
        replicas = self.world_size * self.n_local
        if train.batch_size % replicas:
            raise ValueError(
                f"train.batch_size {train.batch_size} must be a multiple of the {replicas} replicas "
                f"({counted(self.world_size, 'process')} x {counted(self.n_local, 'local device')}): run on a number "
                "of replicas that "
                "divides it (--host-devices N on CPU, N processes under mpirun), or --set train.batch_size=M with M "
                f"a multiple of {replicas} (on a resume, a new global batch does not keep the data order)"
            )
        if train.batch_size // replicas % train.accumulate_steps:
            raise ValueError(
                f"train.batch_size {train.batch_size} gives each of the {replicas} replicas "
                f"{train.batch_size // replicas} examples, which train.accumulate_steps {train.accumulate_steps} "
                f"does not split evenly: make train.batch_size a multiple of {replicas * train.accumulate_steps}"
            )
        self.shard = Shard(self.rank, self.world_size)
        if batches is None:
            batches = task.train_batches(train.batch_size // self.world_size, self.shard, train.seed)
        self.batches = batches
        self.check_batch = BatchCheck(batches, train, self.world_size, self.n_local, self.rank)
        epoch_steps = self.batches.steps_per_epoch
        # max_steps, when set, is the run's length (the data repeats as often as that takes).
        self.total_steps = train.epochs * epoch_steps if train.max_steps is None else train.max_steps
        best_metric = config_lib.best_metric(config.checkpoint, task.metrics)  # a name the task reports
        self.checkpoints = Checkpoints(self.workdir / "checkpoints", config.checkpoint.keep, best_metric)
        self.bucket_bytes = train.bucket_bytes or default_bucket_bytes(self.devices[0].platform)
        self.sync = sync_for(self.world_size, train.allreduce, self.bucket_bytes, train.allreduce_dtype,
                             train.across_processes)
        self._plan([[0, self.total_steps]])
        self.predict = make_predict(task)
        self.progress = Progress(enabled=self.rank == 0)
        self.throughput = metrics_lib.Throughput({"examples": 0, "seconds": 0.0})
        self._unchecked_losses: list[tuple[int, Any, list[str]]] = []  # (step, loss, the batch's sources)
        self._in_flight: collections.deque = collections.deque()  # the losses of the steps not yet waited for

    # -- state

    def init_state(self) -> TrainState:
        """The state before step 1, rank 0's on every process."""
        train = self.config.train
        return self.exchange.broadcast(init_train_state(self.task, self.optimizer, train.seed, train.compute_dtype))

    # -- the step

    def _plan(self, plan: list) -> None:
        """The schedule, optimizer and step of a run whose length is `plan` (optim.planned_schedule)."""
        self.schedule_plan = plan
        self.schedule = planned_schedule(self.config.optim, self.batches.steps_per_epoch, plan)
        train = self.config.train
        self.optimizer = optimizer_for(self.config.optim, self.schedule, self.task, sharded=train.shard_optimizer)
        self.step_parts = StepParts(self.task, self.optimizer, train.compute_dtype, train.accumulate_steps,
                                    first_replica=self.rank * self.n_local, shard_optimizer=train.shard_optimizer,
                                    clip_norm=self.config.optim.clip_norm,
                                    decay_mask=decay_mask_of(self.config.optim))
        self._step = make_train_step(self.step_parts, self.sync, self.devices)
        self.sharded = sharded_step.sharded_update(self.step_parts, self.sync) if train.shard_optimizer else None

    def on_devices(self, state: TrainState) -> TrainState:
        """A host state on the local devices, as the step takes it (under train.shard_optimizer, each
        device's blocks of the optimizer state: sharded_step.py)."""
        return replicate(state, self.devices) if self.sharded is None else sharded_step.on_devices(
            state, self.sharded, self.devices)

    def on_host(self, state: TrainState) -> TrainState:
        """The host state, in the replicated step's layout, of a state on the local devices."""
        return unreplicate(state) if self.sharded is None else sharded_step.on_host(
            state, self.sharded, self.exchange.all_gather)

    def train_step(self, state: TrainState, batch: dict):
        """One synchronous step on a process batch; `state` is replicated over local devices."""
        return self._step(state, split_for_devices(batch, self.n_local))

    def time_sync(self, state: TrainState) -> float:
        """Median seconds of the sync alone on a tree shaped like the gradients (collective)."""
        return self.sync.time_mean(state.params, SYNC_TIMING_REPEATS, SYNC_TIMING_WARMUP)

    # -- evaluation and checkpoints

    def evaluate(self, state: TrainState, split: str) -> dict[str, float]:
        """Task metrics on `split`; dev is cut to eval.max_examples, test is scored whole."""
        cfg = self.config.eval
        limit = cfg.max_examples if split == "dev" else None
        self.progress.status(f"evaluating {split}" + (f" (at most {limit} examples)" if limit else ""))
        started = time.perf_counter()
        batches = self.task.eval_batches(split, cfg.batch_size, self.shard, limit)
        variables = variables_of(state)
        result = evaluate(self.task, self.predict, variables, batches, self.n_local, self.exchange.comm)
        self.progress.status(f"{split}: {self._format_metrics(result)} ({time.perf_counter() - started:.1f} s)")
        return result

    def _format_metrics(self, result: dict) -> str:
        """The task's metrics as it declares them (MetricNames.format)."""
        return ", ".join(f"{k} {self.task.metrics.format(k, v)}" for k, v in result.items())

    def save(self, state: TrainState, metrics: dict | None = None, row: dict | None = None) -> None:
        """Checkpoints `state` with `row`, its metrics.jsonl row, so that a resume writes that row again."""
        self._check_losses()  # a diverged step names its batch before any checkpoint is written
        self.exchange.check_replicas(state.params)  # collective: every process verifies before rank 0 writes
        # Collective under train.shard_optimizer (every process' blocks of the optimizer state); else local.
        host_state = self.on_host(state) if self.sharded is not None or self.rank == 0 else None
        if self.rank != 0:
            return
        step = int(host_state.step)
        row = row if row is not None and len(row) > 1 else None
        extra = {"batches": self.batches.state(), "row": row, "metrics": metrics, THROUGHPUT_KEY: self.throughput.totals(),
                 SCHEDULE_PLAN_KEY: self.schedule_plan, run_shape.SHAPE_KEY: self.shape()}
        path = self.checkpoints.save(step, host_state, extra, metrics)
        rundir.discard_replaced(self.workdir)  # what --overwrite set aside goes once a new checkpoint exists
        best = self.checkpoints.best() if metrics else None
        note = f", the best so far by dev {best['metric']}" if best and best["step"] == step else ""
        self.progress.status(f"saved the checkpoint of step {step} ({path}{note})")

    def shape(self) -> dict:
        """What a checkpoint records of the shape it trained on (run_shape.SHAPE_KEY)."""
        return run_shape.shape(self.world_size, self.n_local, self.devices[0].platform, self.config.train.batch_size)

    def restore(self, template: TrainState) -> tuple[TrainState, dict]:
        """(the newest intact checkpoint's state, its extra: data position, metrics.jsonl row, throughput)."""
        state, extra = self.load_checkpoint(template, LATEST)
        if missing := [key for key in RESUME_KEYS if key not in extra]:
            raise CheckpointError(
                f"the checkpoint of step {int(state.step)} in {self.checkpoints.directory} has no {', '.join(missing)} "
                "record: a jaxring from before the first release wrote it, and a run cannot resume from it; "
                "start the run over with --overwrite")
        self.batches.restore(extra["batches"])
        if self.rank == 0:
            self.checkpoints.update_best(int(state.step), extra.get("metrics"))
        return state, extra

    def load_checkpoint(self, template: TrainState, which: int | str) -> tuple[TrainState, dict]:
        """(state, extra) of checkpoint `which` (jaxring/engine/checkpoint.py) as process 0 reads it, on every process.

        Process 0 alone writes checkpoints and alone reads them; the others get
        its state by broadcast. So every process resumes, and scores test, on
        the same weights whether or not the processes share a filesystem.
        """
        loaded = {}

        def read():
            loaded["state"], extra = self.checkpoints.restore(template, which)
            return extra

        extra = self.exchange.from_lead(f"checkpoint {which}", read)
        return self.exchange.broadcast(loaded.get("state", template)), extra

    def _check_losses(self) -> None:
        """Raises FloatingPointError at the first non-finite loss of the steps not yet checked.

        Checked at log rows and checkpoints only, so that steps stay dispatched asynchronously.
        """
        for step, loss, sources in self._unchecked_losses:
            value = float(np.asarray(loss)[0])
            if not math.isfinite(value):
                named = f" on a batch of {', '.join(sources[:8])}{' ...' if len(sources) > 8 else ''}" if sources else ""
                raise FloatingPointError(
                    f"loss is {value} at step {step}{named}; no checkpoint of this step or later is written. "
                    "Check those inputs, or lower optim.learning_rate or set optim.clip_norm"
                )
        self._unchecked_losses.clear()

    # -- the loop

    def fit(self, resume: bool = False, overwrite: bool = False) -> dict:
        """Trains to the end, evaluates and writes the run directory; returns the summary.

        `resume` / `overwrite`: what to do with a run already in the directory
        (jaxring/engine/rundir.py); without either, such a directory is an error.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        steps = self.exchange.from_lead("the checkpoint steps", self.checkpoints.steps)
        resume = rundir.take_over(self.workdir, steps, resume, overwrite, self.rank == 0)
        data_report = self.exchange.check_before_training(self.config, self.task)
        state = self.init_state()
        n_params = count_params(state.params)
        state, resumed_row = self._resume(state) if resume else (state, None)
        start = int(state.step)
        log = None  # the lead process's alone: it writes the run directory
        if self.rank == 0:
            log = self._open_run_directory(data_report, start if resume else None, resumed_row, n_params)
        state = self.on_devices(state)
        sync_s = self.time_sync(state)
        self.progress.status(f"sync of a gradient-shaped tree alone: {1e3 * sync_s:.1f} ms (timed once at start-up)")
        state, row, last = self._train(state, start, log, sync_s)
        return self._conclude(state, row, last, log, sync_s, n_params)

    def _resume(self, template: TrainState) -> tuple[TrainState, dict | None]:
        """(the newest intact checkpoint's state, its metrics.jsonl row); refuses a run that already ended."""
        state, extra = self.restore(template)
        step = int(state.step)
        self.throughput = metrics_lib.Throughput(extra[THROUGHPUT_KEY], resumed_at_step=step)
        rundir.refuse_finished(self.workdir, step, self.total_steps)
        note = run_shape.resume_note(extra[run_shape.SHAPE_KEY], self.shape(), step, self.batches)
        if note:
            self.progress.status(note)
        plan = extra[SCHEDULE_PLAN_KEY]
        if plan[-1][1] != self.total_steps:
            self._plan([*plan, [step, self.total_steps]])
            self.progress.status(
                f"the run's length changed from {plan[-1][1]} to {self.total_steps} steps: the learning rate goes on "
                f"from step {step}'s ({float(self.schedule(step)):.3g}), the rest of optim.schedule "
                f"{self.config.optim.schedule} stretched to step {self.total_steps}")
        else:
            self._plan(plan)
        return state, extra.get("row")

    def _open_run_directory(self, data_report: dict | None, resume_step: int | None, resumed_row: dict | None,
                            n_params: int) -> metrics_lib.RunLog:
        """The lead process's start: config.yaml, data_report.json, the run log and the run's first status line."""
        cfg = self.config
        self.checkpoints.discard_partial()
        config_lib.save(cfg, self.workdir / "config.yaml")
        if data_report is not None:
            metrics_lib.write_json(self.workdir / "data_report.json", data_report)
            for split in data_report.values():
                self.progress.status(f"data {split['summary']}")
        log = metrics_lib.RunLog(self.workdir, resume_step=resume_step, resumed_row=resumed_row)
        per_device = cfg.train.batch_size // (self.world_size * self.n_local)
        self.progress.status(
            f"jaxring: {counted(self.n_local, f'local {self.devices[0].platform} device')} x "
            f"{counted(self.world_size, 'process')}, "
            f"global batch {cfg.train.batch_size} ({per_device} per device), {n_params:,} parameters, "
            f"all-reduce {cfg.train.allreduce} in buckets of {self.bucket_bytes:,} B, {self.total_steps} steps "
            f"({self.batches.steps_per_epoch} per epoch)"
            + (f", resuming at step {resume_step}" if resume_step is not None else "")
        )
        return log

    def _train(self, state: TrainState, start: int, log, sync_s: float) -> tuple[TrainState, dict, dict]:
        """Steps start + 1 to the last: (state, the last step's row, the latest value of every logged key).

        The last step is neither evaluated nor saved here: _conclude does both."""
        self.progress.start(self.total_steps, start)
        window = _Window()
        last: dict = {}
        row: dict = {"step": start}
        batches = iter(self.batches)
        self.throughput.start()
        for step in range(start + 1, self.total_steps + 1):
            state, out = self._dispatch(state, next(batches), step, window, first=step == start + 1)
            row = {"step": step}
            if step % self.config.train.log_every == 0 or step == self.total_steps:
                self._check_losses()
                jax.block_until_ready(out)  # steps are dispatched asynchronously: time them done
                row.update(self._log_row(step, out, window, sync_s))
            if step == self.total_steps:
                self.progress.logged(step, self._postfix({**last, **row}))
                break
            self._evaluate_or_save(state, step, row)
            if len(row) > 1:
                last.update(row)
                if log is not None:
                    log.write(row)
                if "loss" in row:
                    self.progress.logged(step, self._postfix(last))
                window.restart()
            self.progress.advance()
        self.throughput.stop()
        self.progress.close()
        return state, row, last

    def _dispatch(self, state: TrainState, batch: dict, step: int, window: _Window, first: bool):
        """Queues step `step` without waiting for it; waits for the step STEPS_IN_FLIGHT back, and for
        the first step, which compiles."""
        batch, sources = split_sources(batch)
        self.check_batch(batch, step)
        global_rows = batch_rows(batch) * self.world_size
        window.add(global_rows)
        self.throughput.add(global_rows)
        if first:
            self.progress.status("compiling the training step (the first step runs when it is compiled)")
        state, out = self.train_step(state, batch)
        self._unchecked_losses.append((step, out["loss"], sources))
        self._in_flight.append(out["loss"])
        if len(self._in_flight) > STEPS_IN_FLIGHT:
            self._in_flight.popleft().block_until_ready()
        if first:
            jax.block_until_ready(out)
            self.progress.status(f"first step compiled and run in {time.perf_counter() - window.started:.1f} s")
        return state, out

    def _log_row(self, step: int, out: dict, window: _Window, sync_s: float) -> dict:
        elapsed = time.perf_counter() - window.started
        step_s = elapsed / window.steps
        return {
            "step": step,
            "epoch": (step - 1) // self.batches.steps_per_epoch,
            "loss": float(out["loss"][0]),
            "grad_norm": float(out["grad_norm"][0]),
            "learning_rate": float(self.schedule(step - 1)),
            "examples_per_s": window.examples / elapsed,
            "step_s": step_s,
            # An estimate, not a measurement: the sync timed alone once at start-up (time_sync)
            # over this window's measured mean step.
            "allreduce_share_estimate": min(1.0, sync_s / step_s),
        }

    def _evaluate_or_save(self, state: TrainState, step: int, row: dict) -> None:
        """Dev metrics and a checkpoint every eval.every_steps, else a checkpoint every checkpoint.every_steps."""
        cfg = self.config
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
            dev = self.evaluate(state, "dev")
            row.update({f"dev_{k}": v for k, v in dev.items()})
            self.save(state, dev, row)
        elif cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            self.save(state, row=row)

    def _conclude(self, state: TrainState, row: dict, last: dict, log, sync_s: float, n_params: int) -> dict:
        """The last step evaluated and saved, test scored, the summary written (lead process); the summary."""
        dev = self.evaluate(state, "dev")
        row.update({f"dev_{k}": v for k, v in dev.items()})
        last.update(row)
        self.save(state, dev, row)
        summary = self._summary(last, dev, sync_s, n_params)
        summary["best_step"] = best_step = self._best_step()
        if self.config.eval.test_at_end:
            summary.update(self._test_scores(state, best_step))
        if log is not None:
            log.write(row)
            rows = log.rows()
            log.close()
            metrics_lib.write_json(self.workdir / "summary.json", summary)
            metrics_lib.plot_curves(rows, self.workdir / "plots", self.task.metrics)
        return summary

    def _summary(self, last: dict, dev: dict, sync_s: float, n_params: int) -> dict:
        cfg = self.config
        return {
            "steps": self.total_steps,
            "epochs": self.total_steps / self.batches.steps_per_epoch,
            "parameters": n_params,
            "processes": self.world_size,
            "local_devices": self.n_local,
            "global_batch": cfg.train.batch_size,
            "allreduce": cfg.train.allreduce,
            "across_processes": self.sync.across_processes,  # what crossed processes (one process: jaxring, nothing)
            "bucket_bytes": self.bucket_bytes,
            **self.throughput.summary(),
            "loss": last.get("loss"),
            # the last train.log_every window alone: the pace of the steps, without the evaluations and checkpoints
            **{f"last_window_{k}": last.get(k) for k in ("examples_per_s", "step_s", "allreduce_share_estimate")},
            "allreduce_s": sync_s,
            **{f"dev_{k}": v for k, v in dev.items()},
        }

    def _test_scores(self, state: TrainState, best_step: int | None) -> dict:
        """test_* of the best checkpoint's weights (the final state's when it is the best), and their step."""
        if best_step is not None and best_step != self.total_steps:
            # BEST: a damaged best checkpoint falls back to the newest intact one, named on stderr.
            best, _ = self.load_checkpoint(self.on_host(state), BEST)
            state = self.on_devices(best)
        test = self.evaluate(state, "test")
        # The step whose weights produced test_*: best_step unless its checkpoint was damaged.
        return {"test_step": int(np.asarray(state.step)[0]), **{f"test_{k}": v for k, v in test.items()}}

    def _best_step(self) -> int | None:
        """The best checkpoint's step, as process 0 (which writes checkpoints) sees it."""
        best = self.exchange.from_lead("the best step", self.checkpoints.best)
        return None if best is None else best["step"]

    def _postfix(self, row: dict) -> dict:
        shown = {"loss": f"{row['loss']:.3f}"} if "loss" in row else {}
        for name in self.task.metrics.shown:
            if f"dev_{name}" in row:
                shown[f"dev_{name}"] = self.task.metrics.format(name, row[f"dev_{name}"], decimals=1)
        if "examples_per_s" in row:
            shown["ex/s"] = f"{row['examples_per_s']:.0f}"
        if "allreduce_share_estimate" in row:
            shown["allreduce"] = f"{100 * row['allreduce_share_estimate']:.0f}%"
        return shown
