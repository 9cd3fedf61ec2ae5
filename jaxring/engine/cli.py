"""The command lines of jaxring-train and jaxring-evaluate (pyproject.toml's [project.scripts]).

The checkout's scripts/train.py and evaluate.py are these same commands, with
the checkout's tasks registered and its configs' relative paths resolved in the
checkout (jaxring/engine/experiment.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxring.engine import config as config_lib
from jaxring.engine import registry
from jaxring.engine.launch import evaluate_run, run

TRAIN_DESCRIPTION = "Trains the task an experiment config names with jaxring's synchronous data-parallel SGD."
EVALUATE_DESCRIPTION = "Scores a trained run again with its task's metrics: JSON on stdout."


def parse_train_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=TRAIN_DESCRIPTION)
    parser.add_argument("--config", type=Path, help="experiment YAML (default with --resume: WORKDIR/config.yaml)")
    parser.add_argument("--workdir", type=Path,
                        help="run directory (default: runs/<config name> in the current directory)")
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


def train(argv=None, paths_relative_to=None) -> dict:
    """jaxring-train on `argv` (default: sys.argv); the run's summary. `paths_relative_to`: jaxring.engine.run's."""
    args = parse_train_args(argv)
    return run(args.config, args.workdir, args.overrides, resume=args.resume, overwrite=args.overwrite,
               host_devices=args.host_devices, paths_relative_to=paths_relative_to)


def evaluate(argv=None, paths_relative_to=None) -> dict:
    """jaxring-evaluate on `argv` (default: sys.argv): the scores it prints."""
    parser = argparse.ArgumentParser(description=EVALUATE_DESCRIPTION,
                                     epilog="A task may add options of its own: --workdir RUN --help lists them.")
    parser.add_argument("--workdir", type=Path, required=True,
                        help="a run directory of jaxring-train (scripts/train.py)")
    parser.add_argument("--split", default="test", help="the split of the run's data to score (default: test)")
    parser.add_argument("--checkpoint", default="best",
                        help="best (by the run's checkpoint.best_metric), latest or a step number")
    parser.add_argument("--batch-size", type=int, help="default: the run's eval.batch_size")
    try:
        add_task_arguments(parser, argv)
    except ValueError as e:  # ConfigError: the run's config or the task it names
        sys.exit(f"error: {e}")
    return evaluate_run(parser.parse_args(argv), paths_relative_to)


def add_task_arguments(parser: argparse.ArgumentParser, argv) -> None:
    """The options of the task that trained --workdir, when it has any (read before the rest is parsed)."""
    workdir = argparse.ArgumentParser(add_help=False)
    workdir.add_argument("--workdir", type=Path)
    run_dir = workdir.parse_known_args(argv)[0].workdir
    if run_dir is None or not (run_dir / "config.yaml").is_file():
        return  # parse_args, then load_run, name what is missing
    add = getattr(registry.task_class(config_lib.task_name(run_dir / "config.yaml")), "add_evaluate_arguments", None)
    if add is not None:
        add(parser)


def train_command() -> None:
    """The jaxring-train command: its summary is the run directory's summary.json."""
    train()


def evaluate_command() -> None:
    """The jaxring-evaluate command: its scores are on stdout."""
    evaluate()
