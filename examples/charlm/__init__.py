"""A character-level transformer language model trained with jaxring, on text it writes itself.

data.py (a seeded grammar's text) and model.py (a small causal transformer,
flax) know nothing of jaxring; task.py adapts them to the engine's Task
contract (jaxring/engine/task.py). Its gradients are large against its
compute: about 0.46 M float32 parameters in 54 leaves for 2,048 predicted
characters a batch. docs/YOUR_MODEL.md points here as the second example.
"""
