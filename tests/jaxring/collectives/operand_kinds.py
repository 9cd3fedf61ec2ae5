"""Every kind of operand jax.lax's collectives take, as a user passes them (tests compare jaxring with lax on each).

Each is a function of the mapped function's argument `v`, this device's block
of shape BLOCK.
"""

import jax.numpy as jnp
import numpy as np

from tests.jaxring.collectives.random_inputs import random_array

BLOCK = (3, 5)
_RNG = np.random.default_rng(40)
CLOSED_NUMPY = random_array(_RNG, BLOCK, jnp.float32)
CLOSED_JAX = jnp.asarray(random_array(_RNG, BLOCK, jnp.float32))

OPERANDS = {
    "python-int": lambda v: 3,
    "python-float": lambda v: 2.5,
    "python-bool": lambda v: True,
    "numpy-float32": lambda v: np.float32(-1.25),
    "numpy-int32": lambda v: np.int32(7),
    "numpy-0d": lambda v: np.asarray(0.75, np.float32),
    "jax-0d": lambda v: jnp.asarray(-0.5, jnp.float32),
    "closed-over-numpy": lambda v: CLOSED_NUMPY,
    "closed-over-jax": lambda v: CLOSED_JAX,
    "argument": lambda v: v,
    "computed": lambda v: v * 2.0 + 1.0,
    "computed-0d": lambda v: v.sum(),
    "empty": lambda v: v[:, :0],
}
