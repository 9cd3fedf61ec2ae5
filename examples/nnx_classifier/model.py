"""The classifier as Flax NNX modules: Linear, BatchNorm, ReLU and Dropout per hidden layer, returning logits."""

from __future__ import annotations

from flax import nnx


class MLP(nnx.Module):
    def __init__(self, features: int, hidden: tuple[int, ...], classes: int, dropout: float, *, rngs: nnx.Rngs):
        widths = (features, *hidden)
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths, widths[1:])])
        self.norms = nnx.List([nnx.BatchNorm(width, rngs=rngs) for width in hidden])
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.out = nnx.Linear(widths[-1], classes, rngs=rngs)

    def __call__(self, x):
        for layer, norm in zip(self.layers, self.norms):
            x = self.dropout(nnx.relu(norm(layer(x))))
        return self.out(x)
