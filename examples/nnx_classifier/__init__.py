"""The classifier of examples/classifier as a Flax NNX model: an nnx.Module with BatchNorm and Dropout,
trained with jaxring through jaxring/engine/nnx_task.py's NNXTask, with no conversion code of its own.

It reuses examples/classifier's data (classifier.data) and batches; model.py knows nothing of jaxring.
docs/YOUR_MODEL.md, "An NNX model", walks through it.
"""
