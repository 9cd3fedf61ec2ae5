"""The training engine: the Task contract, gradient sync, the trainer, configs, checkpoints, run logs.

It imports jaxring.collectives; the collectives never import the engine.
"""
