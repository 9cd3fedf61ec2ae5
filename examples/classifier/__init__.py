"""A classifier trained with jaxring: an MLP (flax) on Gaussian clusters it makes itself.

data.py and model.py know nothing of jaxring; task.py adapts them to the
engine's Task contract (jaxring/engine/task.py); examples/library_training.py
trains the same model with jaxring's all-reduce alone. docs/YOUR_MODEL.md
walks through both.
"""
