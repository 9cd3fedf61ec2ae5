"""The classifier: an MLP with ReLU, returning logits."""

from __future__ import annotations

import flax.linen as nn


class MLP(nn.Module):
    hidden: tuple[int, ...]
    classes: int

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.classes)(x)
