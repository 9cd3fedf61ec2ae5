"""Trains the task an experiment config names with jaxring's synchronous data-parallel SGD.

    python scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/ds2_tiny
    python scripts/train.py --config examples/classifier/classifier.yaml --host-devices 2
    python scripts/train.py --config configs/ds2_tiny.yaml --set optim.learning_rate=1e-3 --allreduce psum
    python scripts/train.py --workdir runs/ds2_tiny --resume
    python scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/ds2_tiny --overwrite
    mpirun -np 2 python -m mpi4py scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/mpi

The config's `task:` names the model: a registered name (deepspeech2), an
installed package's entry point, or an import path package.module:Class
(docs/YOUR_MODEL.md). The run directory (default: runs/<config name> in the
current directory) gets config.yaml (the resolved config), metrics.jsonl,
summary.json, data_report.json, checkpoints/, plots/ and TensorBoard events.
A directory that holds checkpoints needs --resume or --overwrite
(jaxring/engine/rundir.py). Under mpirun, an error on any process ends the job.
"""

import argparse
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, help="experiment YAML (default with --resume: WORKDIR/config.yaml)")
    parser.add_argument("--workdir", type=Path, help="run directory (default: runs/<config name> in the current directory)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest intact checkpoint in WORKDIR (none: start fresh)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a WORKDIR that holds a run; its files are deleted once the new run "
                        "has written its first checkpoint")
    parser.add_argument("--allreduce", choices=["ring", "psum"],
                        help="gradient all-reduce: jaxring's ring or jax.lax.pmean (same as --set train.allreduce=...)")
    parser.add_argument("--host-devices", type=int,
                        help="split the CPU into this many XLA devices for data parallelism on the host "
                        "(default: XLA's single CPU device; `make train` uses 2, docs/TRAINING.md)")
    args = parser.parse_args(argv)
    if args.config is None and not (args.resume and args.workdir):
        parser.error("give --config, or --workdir with --resume to continue a run with its saved config")
    if args.resume and args.overwrite:
        parser.error("give --resume or --overwrite, not both")
    if args.workdir is None:
        args.workdir = Path("runs") / args.config.stem
    if args.config is None:
        args.config = args.workdir / "config.yaml"
    if args.allreduce:
        args.overrides.append(f"train.allreduce={args.allreduce}")
    return args


def expose_host_devices(count: int) -> None:
    """Splits the CPU into `count` XLA devices, unless XLA_FLAGS already says how many, and gives XLA's
    CPU client the threads steps queued over them need (jaxring/collectives/xla_threads.py)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    from jaxring.collectives.xla_threads import reserve_client_threads

    reserve_client_threads()


_task_lines = None  # the handler show_task_progress added, replaced when main() runs again


def show_task_progress(task_module: str) -> None:
    """Timestamped lines on stdout for what the task's package logs at INFO (a corpus being synthesised,
    say): a minute of silence otherwise. `task_module`: the task class's module; its top-level package's
    logger is the parent of every logger the task's modules get with logging.getLogger(__name__)."""
    global _task_lines
    from jaxring.engine.progress import TIMESTAMP_FORMAT

    if _task_lines is not None:
        _task_lines[0].removeHandler(_task_lines[1])
    logger = logging.getLogger(task_module.partition(".")[0])
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", TIMESTAMP_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _task_lines = (logger, handler)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.host_devices:
        expose_host_devices(args.host_devices)

    from jaxring.collectives.abort import abort_on_uncaught_exception, exit_job, runtime_error_text, start_mpi

    start_mpi()  # before anything imports mpi4py: a process that never starts ends the job
    abort_on_uncaught_exception()  # a process that fails ends the job, rather than leave the others waiting

    import jax
    import jaxring
    import models
    from jaxring.engine import config as config_lib
    from jaxring.engine import tasks
    from jaxring.engine.checkpoint import CheckpointError
    from jaxring.engine.metrics import write_json
    from jaxring.engine.report import final_report
    from jaxring.engine.rundir import RunDirectoryError
    from jaxring.engine.task import DataError
    from jaxring.engine.trainer import Trainer

    try:
        config = models.load_config(args.config, args.overrides)
        world = jaxring.init()
        if world.rank == 0:
            show_task_progress(tasks.task_class(config.task).__module__)
        task = models.build_task(config)
        summary = Trainer(task, config, args.workdir, world).fit(resume=args.resume, overwrite=args.overwrite)
    except (config_lib.ConfigError, RunDirectoryError, CheckpointError, DataError, FloatingPointError,
            TimeoutError) as e:
        exit_job(f"error: {e}")
    except jax.errors.JaxRuntimeError as e:
        if "jaxring" not in str(e):  # a jaxring handler's timeout names the process; others keep their traceback
            raise
        exit_job(f"error: {runtime_error_text(e)}")
    if world.rank == 0:
        summary, line = final_report(task, config, args.workdir, summary, world.local_devices[0].platform)
        write_json(args.workdir / "summary.json", summary)
        print(line, flush=True)
    return summary


if __name__ == "__main__":
    main()
