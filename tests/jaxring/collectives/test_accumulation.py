"""The accumulation type names a dtype however it is given (a dtype, a scalar type, a name)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxring.collectives.accumulation import accumulation_dtype


@pytest.mark.parametrize("given", [jnp.bfloat16, np.float16, "float16", np.dtype(jnp.bfloat16)])
def test_16_bit_floats_accumulate_in_float32_however_named(given):
    assert accumulation_dtype(given) == np.float32


@pytest.mark.parametrize("given", [np.float32, np.int32, "float64"])
def test_wider_types_and_integers_accumulate_in_themselves(given):
    assert accumulation_dtype(given) == np.dtype(given)
