"""The training engine: the Task contract, gradient sync, the trainer, configs, checkpoints, run logs.

`run` trains the experiment a config file names and `evaluate_run` scores a
finished run again (jaxring/engine/launch.py; the commands jaxring-train and
jaxring-evaluate). It imports jaxring.collectives; the collectives never import the engine.
"""

from jaxring.engine.launch import evaluate_run, run

__all__ = ["evaluate_run", "run"]
