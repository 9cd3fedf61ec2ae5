"""The checkout's tasks, and how the scripts resolve every config and run directory.

The task registry is the engine's (jaxring/engine/tasks.py); Deep Speech 2
registers there like any other task. A task of your own needs no line here:
name it in its config by import path (`task: mypkg.task:MyTask`) or by an
entry point (docs/YOUR_MODEL.md).
"""

from __future__ import annotations

from pathlib import Path

from jaxring.engine import config as config_lib
from jaxring.engine import tasks
from jaxring.engine.checkpoint import load_variables

# Relative paths in experiment files (data.cache_dir: data/cache, manifests) mean paths
# inside the checkout, whichever folder holds the file and whichever directory a
# script runs from (the rule: jaxring/engine/config.py).
REPO_ROOT = Path(__file__).resolve().parents[1]

tasks.register("deepspeech2", "models.deepspeech2.task:DeepSpeech2Task")


def load_config(path, overrides=()) -> config_lib.Config:
    """The experiment at `path`, validated against the sections of the task it names."""
    sections = tasks.config_sections(tasks.task_class(config_lib.task_name(path)))
    return config_lib.load(path, sections, overrides, paths_relative_to=REPO_ROOT)


def build_task(config: config_lib.Config):
    """The task object a resolved config describes."""
    return tasks.build_task(tasks.task_class(config.task), config)


def load_run(workdir, checkpoint: str = "best"):
    """(config, task, variables, step) of a run directory written by scripts/train.py."""
    path = Path(workdir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {workdir} a run directory of scripts/train.py?")
    config = load_config(path)
    variables, step = load_variables(workdir, checkpoint)
    return config, build_task(config), variables, step
