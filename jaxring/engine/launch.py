"""Running an experiment, as jaxring-train and jaxring-evaluate (and the checkout's scripts/train.py and
evaluate.py) do: `run` trains, `evaluate_run` scores a finished run again.

Under mpirun every process calls `run`. MPI starts before anything imports
mpi4py, so a process that never starts ends the job; an uncaught error on any
process ends the whole job rather than leave the others waiting; an error the
engine explains (config, data, run directory, checkpoint, a diverged loss, a
timeout) ends it with that one line and exit status 1
(jaxring/collectives/abort.py). Their command lines: jaxring/engine/cli.py.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import jax

import jaxring
from jaxring.collectives.abort import abort_on_uncaught_exception, exit_job, start_mpi
from jaxring.collectives.timeout import runtime_error_text
from jaxring.collectives.xla_threads import reserve_client_threads
from jaxring.engine import config as config_lib
from jaxring.engine import registry, run_shape
from jaxring.engine.checkpoint import CheckpointError
from jaxring.engine.evaluation import score_split
from jaxring.engine.experiment import build_task, load_config, load_run
from jaxring.engine.metrics import write_json
from jaxring.engine.progress import TIMESTAMP_FORMAT
from jaxring.engine.report import final_report
from jaxring.engine.rundir import RunDirectoryError
from jaxring.engine.task import DataError


_DEVICE_COUNT_FLAG = "xla_force_host_platform_device_count"


def expose_host_devices(count: int) -> None:
    """Splits the CPU into `count` XLA devices, unless XLA_FLAGS already says how many, and gives XLA's
    CPU client the threads steps queued over them need (jaxring/collectives/xla_threads.py)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_COUNT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    reserve_client_threads()


def resumed_host_devices(workdir: Path) -> int | None:
    """The --host-devices of a resume whose command line gives none: the CPU devices per process that the
    checkpoint it continues trained on (run_shape.SHAPE_KEY), said in one line; None where that was one device,
    no CPU, unknown, or XLA_FLAGS sets the count. Collective under MPI (rank 0 reads the checkpoint, as the
    resume does); call it before JAX starts."""
    if _DEVICE_COUNT_FLAG in os.environ.get("XLA_FLAGS", ""):
        return None
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    shape = run_shape.trained_shape(workdir) if comm.rank == 0 else None
    shape = comm.bcast(shape, root=0)
    if not shape or shape["platform"] != "cpu" or shape["local_devices"] == 1:
        return None
    count = shape["local_devices"]
    if comm.rank == 0:
        print(f"--resume: the run trained on {count} CPU devices per process: --host-devices {count} again "
              "(give --host-devices to choose another count)", flush=True)
    return count


_task_lines = None  # the handler show_task_progress added, replaced when run() runs again


def show_task_progress(task_module: str) -> None:
    """Timestamped lines on stdout for what the task's package logs at INFO (a corpus being synthesised,
    say): a minute of silence otherwise. `task_module`: the task class's module; its top-level package's
    logger is the parent of every logger the task's modules get with logging.getLogger(__name__)."""
    global _task_lines
    if _task_lines is not None:
        _task_lines[0].removeHandler(_task_lines[1])
    logger = logging.getLogger(task_module.partition(".")[0])
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", TIMESTAMP_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _task_lines = (logger, handler)


def run(config: str | Path, workdir: str | Path, overrides=(), resume: bool = False, overwrite: bool = False,
        host_devices: int | None = None, paths_relative_to: str | Path | None = None) -> dict:
    """Trains the experiment at `config` (YAML; `overrides`: "section.key=value" strings) in run directory
    `workdir`, on this process's devices; returns the summary (the lead process adds the task's final report
    and writes it to WORKDIR/summary.json, then prints the run's last line).

    `resume` / `overwrite`: what to do with a run already in `workdir` (jaxring/engine/rundir.py).
    `host_devices`: split the CPU into that many XLA devices (before JAX starts; on a resume, None means
    as many as the checkpoint trained on: resumed_host_devices). `paths_relative_to`: what
    the config's relative paths mean (jaxring/engine/experiment.py; None: the current directory).
    """
    start_mpi()  # before anything imports mpi4py: a process that never starts ends the job
    abort_on_uncaught_exception()  # a process that fails ends the job, rather than leave the others waiting
    workdir = Path(workdir)
    if resume and not host_devices:
        host_devices = resumed_host_devices(workdir)
    if host_devices:
        expose_host_devices(host_devices)  # before JAX starts: jaxring.init() below starts it
    from jaxring.engine.trainer import Trainer  # imports mpi4py (jaxring/collectives/replicas.py): once MPI started

    try:
        experiment = load_config(config, overrides, paths_relative_to)
        world = jaxring.init()
        if world.rank == 0:
            show_task_progress(registry.task_class(experiment.task).__module__)
        task = build_task(experiment)
        summary = Trainer(task, experiment, workdir, world).fit(resume=resume, overwrite=overwrite)
    except (config_lib.ConfigError, RunDirectoryError, CheckpointError, DataError, FloatingPointError,
            TimeoutError) as e:
        exit_job(f"error: {e}")
    except jax.errors.JaxRuntimeError as e:
        if "jaxring" not in str(e):  # a jaxring handler's timeout names the process; others keep their traceback
            raise
        exit_job(f"error: {runtime_error_text(e)}")
    if world.rank == 0:
        summary, line = final_report(task, experiment, workdir, summary, world.local_devices[0].platform)
        write_json(workdir / "summary.json", summary)
        print(line, flush=True)
    return summary


def evaluate_run(args, paths_relative_to: str | Path | None = None) -> dict:
    """Scores the run in `args.workdir` again (its checkpoint `args.checkpoint`) and prints the scores as
    JSON on stdout; returns them. `args`: jaxring-evaluate's parsed options, the task's own among them.

    By default the split `args.split` is scored as training scores it (jaxring/engine/evaluation.py); a task
    with an `evaluate` method (jaxring/engine/task.py) scores in its own way. A run, checkpoint, config or
    data that cannot be scored ends the process with the error and exit status 1, as does a failure the
    task reports once the scores are printed.
    """
    try:
        config, task, variables, step = load_run(args.workdir, args.checkpoint, paths_relative_to)
        if hasattr(task, "evaluate"):  # optional in the Task contract
            result, failure = task.evaluate(args, config, variables)
        else:
            result, failure = score_split(task, config, variables, args.split, args.batch_size), None
    except (FileNotFoundError, CheckpointError, ValueError) as e:  # ValueError: ConfigError, DataError among them
        sys.exit(f"error: {e}")
    result = {**result, "step": step}
    print(json.dumps(result))
    if failure:
        sys.exit(f"error: {failure}")
    return result
