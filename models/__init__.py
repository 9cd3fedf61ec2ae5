"""Tasks trained with jaxring, by the name an experiment's `task:` key gives.

To add a model, write a class that meets jaxring.engine.task.Task, with
`config_sections` (its config sections by name) and `from_config(config)`,
and register its import path in TASKS. Scripts resolve every config and run
directory through this module.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from jaxring.engine import config as config_lib
from jaxring.engine.checkpoint import load_variables

# Relative paths in experiment files (data.cache_dir: data/cache, manifests) mean paths
# inside the checkout, whichever folder holds the file and whichever directory a
# script runs from (the rule: jaxring/engine/config.py).
REPO_ROOT = Path(__file__).resolve().parents[1]

# name -> "module:class"; imported on lookup, so a task's dependencies load only when it is used.
TASKS = {
    "deepspeech2": "models.deepspeech2.task:DeepSpeech2Task",
}


def task_class(name: str):
    """The registered task class called `name`."""
    if name not in TASKS:
        raise config_lib.ConfigError(f"unknown task {name!r}; registered tasks: {', '.join(TASKS)} (models/__init__.py)")
    module, _, attribute = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_config(path, overrides=()) -> config_lib.Config:
    """The experiment at `path`, validated against the sections of the task it names."""
    sections = task_class(config_lib.task_name(path)).config_sections
    return config_lib.load(path, sections, overrides, paths_relative_to=REPO_ROOT)


def build_task(config: config_lib.Config):
    """The task object a resolved config describes."""
    return task_class(config.task).from_config(config)


def load_run(workdir, checkpoint: str = "best"):
    """(config, task, variables, step) of a run directory written by scripts/train.py."""
    path = Path(workdir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {workdir} a run directory of scripts/train.py?")
    config = load_config(path)
    variables, step = load_variables(workdir, checkpoint)
    return config, build_task(config), variables, step
