"""Spectrogram augmentation: frequency warping against numpy interpolation, masks by their definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.deepspeech2.augment import AugmentConfig, augment, warp_frequencies


def random_batch(seed, batch=3, frames=37, bins=161):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((batch, frames, bins)).astype(np.float32)
    lengths = np.array([frames, frames - 11, 5][:batch])
    for i, n in enumerate(lengths):
        features[i, n:] = 0  # padding, as the batches have it
    return features, lengths


@pytest.mark.parametrize("factors", [(1.0, 1.0, 1.0), (0.9, 1.13, 0.5), (1.5, 0.77, 1.01)])
def test_warp_matches_numpy_interpolation(factors):
    features, _ = random_batch(0)
    warped = np.asarray(warp_frequencies(jnp.asarray(features), jnp.asarray(factors, jnp.float32)))
    bins = np.arange(features.shape[-1])
    for i, factor in enumerate(factors):
        source = np.clip(bins * factor, 0, bins[-1])
        expected = np.stack([np.interp(source, bins, row.astype(np.float64)) for row in features[i]])
        np.testing.assert_allclose(warped[i], expected, atol=1e-4)  # float32 positions


def test_disabled_augmentation_is_the_identity():
    features, lengths = random_batch(1)
    assert not AugmentConfig().enabled
    out = augment(AugmentConfig(), jax.random.key(0), jnp.asarray(features), jnp.asarray(lengths))
    np.testing.assert_array_equal(np.asarray(out), features)


@pytest.mark.parametrize("seed", range(4))
def test_masks_zero_whole_bands_and_stretches_inside_the_real_frames(seed):
    features, lengths = random_batch(seed)
    config = AugmentConfig(freq_masks=2, freq_mask_width=13, time_masks=3, time_mask_width=7)
    out = np.asarray(augment(config, jax.random.key(seed), jnp.asarray(features), jnp.asarray(lengths)))
    for i, n in enumerate(lengths):
        changed = out[i] != features[i]
        assert np.all(out[i][changed] == 0) and np.all(out[i, n:] == 0)
        zero_frames = np.flatnonzero((out[i, :n] == 0).all(axis=1))
        kept_frames = np.setdiff1d(np.arange(n), zero_frames)
        zero_bins = np.flatnonzero((out[i, kept_frames] == 0).all(axis=0)) if len(kept_frames) else []
        assert len(zero_bins) <= 2 * 13 and len(zero_frames) <= 3 * 7
        # what is not in a masked band or stretch is untouched
        keep = np.ones_like(changed[:n])
        keep[:, zero_bins] = False
        keep[zero_frames, :] = False
        np.testing.assert_array_equal(out[i, :n][keep], features[i, :n][keep])
    assert (out == 0).sum() > (features == 0).sum()  # something was masked


def test_augmentation_follows_the_rng():
    features, lengths = random_batch(5)
    config = AugmentConfig(warp=0.2, freq_masks=1, time_masks=1)
    run = jax.jit(lambda key: augment(config, key, jnp.asarray(features), jnp.asarray(lengths)))
    np.testing.assert_array_equal(np.asarray(run(jax.random.key(3))), np.asarray(run(jax.random.key(3))))
    assert not np.array_equal(np.asarray(run(jax.random.key(3))), np.asarray(run(jax.random.key(4))))


@pytest.mark.parametrize("keys, message", [
    (dict(warp=1.0), "augment.warp must be in"),
    (dict(time_masks=-1), "augment.time_masks must be >= 0"),
])
def test_bad_settings_are_rejected(keys, message):
    with pytest.raises(ValueError, match=message):
        AugmentConfig(**keys)
