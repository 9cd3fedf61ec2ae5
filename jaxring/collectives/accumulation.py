"""How every jaxring reduction adds and averages, in-jit ring and cross-process alike.

16-bit floats are summed in float32 (rounded once, at the end); every other
type in itself (csrc/core/ring_handler_common.h's kElementTypes). A mean divides the sum by the number of devices the way lax.pmean
does: an integer sum becomes a float (true division), a float is divided in
its accumulation type and cast back.
"""

import jax.numpy as jnp
import numpy as np


def accumulation_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def mean(total, count):
    """`total` (a sum over `count` devices: an int, or an int32 array where each device's group is
    its own size) divided by `count`, typed as lax.pmean types it."""
    if jnp.issubdtype(total.dtype, jnp.integer):
        return total / count
    return (total.astype(accumulation_dtype(total.dtype)) / count).astype(total.dtype)
