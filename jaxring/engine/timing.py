"""How this project times a call: the median wall time of calls run to completion.

The trainer's start-up timing of the sync and every benchmark script use it, so
their numbers mean the same thing.
"""

import time

import jax
import numpy as np


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    """Median seconds of `fn()` with its result ready, over `repeats` calls after `warmup` untimed ones (which compile)."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))
