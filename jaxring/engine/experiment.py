"""An experiment from its files: the config a YAML file names, the task it describes, a run's weights.

Relative paths in a config file (its ConfigPath fields, jaxring/engine/config.py)
resolve against `paths_relative_to`: the checkout's scripts name the checkout
(scripts/train.py), so its configs find data/ from any directory; None (the
installed jaxring-train and jaxring-evaluate, and jaxring.engine.run) means the
current working directory, as for a path typed on the command line. A run
directory's config.yaml writes such paths relative to that folder again, so a
run resumes or is scored from the folder it was started in.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxring.engine import config as config_lib
from jaxring.engine import registry
from jaxring.engine.checkpoint import load_variables


def load_config(path, overrides=(), paths_relative_to=None) -> config_lib.Config:
    """The experiment at `path`, validated against the sections of the task it names."""
    sections = registry.config_sections(registry.task_class(config_lib.task_name(path, overrides)))
    base = os.getcwd() if paths_relative_to is None else paths_relative_to
    return config_lib.load(path, sections, overrides, paths_relative_to=base)


def build_task(config: config_lib.Config):
    """The task object a resolved config describes."""
    return registry.build_task(registry.task_class(config.task), config)


def load_run(workdir, checkpoint: str = "best", paths_relative_to=None):
    """(config, task, variables, step) of a run directory a training wrote (jaxring/engine/launch.py)."""
    path = Path(workdir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {workdir} a run directory of scripts/train.py?")
    config = load_config(path, paths_relative_to=paths_relative_to)
    variables, step = load_variables(workdir, checkpoint)
    return config, build_task(config), variables, step
