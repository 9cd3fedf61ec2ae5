"""Training-time augmentation of spectrograms: frequency warping and SpecAugment masks.

Dev and test of the synthetic corpus speak with voices training never hears; a new
voice mostly moves the formants (a different vocal-tract length) and the pitch, so
stretching the frequency axis (vocal tract length perturbation, Jaitly & Hinton 2013) and
hiding bands and stretches of frames (SpecAugment, Park et al. 2019) make the model lean
less on any one voice's exact spectrum. Runs inside the jitted loss, drawn from the
step's RNG, so a resumed run augments exactly like one never stopped.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """The `augment:` section of an experiment config; the defaults change nothing."""

    warp: float = 0.0  # frequency axis scaled by a factor drawn from [1 - warp, 1 + warp]
    freq_masks: int = 0  # bands of bins set to the utterance mean (0 after normalisation)
    freq_mask_width: int = 20  # widest band, in bins
    time_masks: int = 0  # stretches of frames set to the mean
    time_mask_width: int = 20  # widest stretch, in frames (10 ms each)

    def __post_init__(self):
        if not 0.0 <= self.warp < 1.0:
            raise ValueError(f"augment.warp must be in [0, 1), got {self.warp}")
        for name in ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width"):
            if getattr(self, name) < 0:
                raise ValueError(f"augment.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def enabled(self) -> bool:
        return self.warp > 0 or self.freq_masks > 0 or self.time_masks > 0


def warp_frequencies(features, factors):
    """features [B, T, F] with bin f read from bin f * factor (linear interpolation, clipped
    to the top bin); factors [B]. A factor above 1 moves formants down, below 1 up."""
    bins = features.shape[-1]
    source = jnp.clip(jnp.arange(bins)[None, :] * factors[:, None], 0, bins - 1)  # [B, F]
    low = jnp.floor(source).astype(jnp.int32)
    high = jnp.minimum(low + 1, bins - 1)
    frac = (source - low)[:, None, :]
    take = jax.vmap(lambda x, index: x[:, index])  # per utterance: [T, F] -> [T, F]
    return take(features, low) * (1 - frac) + take(features, high) * frac


def _band_masks(rng, count: int, max_width: int, size: int, limits):
    """[B, size] bool: True inside any of `count` bands of width U[0, max_width] that start
    uniformly in [0, limit - width] of each row (limit: [B] real length)."""
    if count == 0 or max_width == 0:
        return jnp.zeros((limits.shape[0], size), bool)
    width_rng, start_rng = jax.random.split(rng)
    shape = (limits.shape[0], count)
    widths = jax.random.randint(width_rng, shape, 0, max_width + 1)
    widths = jnp.minimum(widths, limits[:, None])
    starts = (jax.random.uniform(start_rng, shape) * (limits[:, None] - widths + 1)).astype(jnp.int32)
    positions = jnp.arange(size)[None, None, :]
    inside = (positions >= starts[..., None]) & (positions < (starts + widths)[..., None])
    return inside.any(axis=1)


def augment(config: AugmentConfig, rng, features, lengths):
    """Augmented copy of features [B, T, F] (lengths [B] real frames; padding stays zero)."""
    if not config.enabled:
        return features
    batch, frames, bins = features.shape
    warp_rng, freq_rng, time_rng = jax.random.split(rng, 3)
    if config.warp > 0:
        factors = jax.random.uniform(warp_rng, (batch,), minval=1 - config.warp, maxval=1 + config.warp)
        features = warp_frequencies(features, factors)
    freq = _band_masks(freq_rng, config.freq_masks, config.freq_mask_width, bins, jnp.full((batch,), bins))
    time = _band_masks(time_rng, config.time_masks, config.time_mask_width, frames, lengths)
    masked = freq[:, None, :] | time[:, :, None]
    return jnp.where(masked, 0.0, features).astype(features.dtype)
