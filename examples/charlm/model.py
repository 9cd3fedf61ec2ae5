"""A causal transformer over characters (pre-norm, learned positions), returning next-character logits.

The query, key and value projections are one Dense, so that a block has 12
parameter leaves: the model's gradients come in few, large arrays.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


def _split_heads(x, heads: int):
    """(batch, length, width) as (batch, length, heads, width / heads)."""
    return x.reshape(*x.shape[:2], heads, x.shape[-1] // heads)


class CausalSelfAttention(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
        batch, length, width = x.shape
        query, key, value = jnp.split(nn.Dense(3 * width, name="qkv")(x), 3, axis=-1)
        query, key, value = (_split_heads(t, self.heads) for t in (query, key, value))
        scores = jnp.einsum("bqhd,bkhd->bhqk", query, key) / jnp.sqrt(width // self.heads)
        causal = jnp.tril(jnp.ones((length, length), bool))  # a position sees itself and the ones before
        weights = nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, value).reshape(batch, length, width)
        return nn.Dense(width, name="out")(mixed)


class Block(nn.Module):
    heads: int
    mlp_ratio: int

    @nn.compact
    def __call__(self, x):
        x = x + CausalSelfAttention(self.heads)(nn.LayerNorm()(x))
        hidden = nn.gelu(nn.Dense(self.mlp_ratio * x.shape[-1])(nn.LayerNorm()(x)))
        return x + nn.Dense(x.shape[-1])(hidden)


class CharTransformer(nn.Module):
    vocab: int
    context: int  # the longest input: the learned position embeddings' count
    width: int
    heads: int
    layers: int
    mlp_ratio: int

    @nn.compact
    def __call__(self, tokens):
        """Logits (batch, length, vocab) of each position's next character, for int tokens (batch, length)."""
        positions = self.param("positions", nn.initializers.normal(0.02), (self.context, self.width))
        x = nn.Embed(self.vocab, self.width)(tokens) + positions[: tokens.shape[1]]
        for _ in range(self.layers):
            x = Block(self.heads, self.mlp_ratio)(x)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))
