"""The random arrays the collectives' tests reduce: one definition for test_ring.py and test_lax_parity.py."""

import jax.numpy as jnp
import numpy as np


def random_array(rng, shape, dtype):
    """int32 in [-1000, 1000); floats never zero, of both signs, with magnitudes the 16-bit types can hold."""
    if dtype == jnp.int32:
        return rng.integers(-1000, 1000, size=shape).astype(np.int32)
    return (rng.standard_normal(shape) + 0.1).astype(np.float32).astype(dtype)
