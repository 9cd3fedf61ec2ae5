"""The time of one collective inside a compiled program, as the benchmarks measure it.

A collective in a training step reduces values the step computed; timed
alone on a jit's argument it pays what no step pays (an in-place op's input
copied first, a fresh output for every call). So the benchmarks time two
programs of the same op chained, one of BASE_OPS ops and one of K, and take
their difference over K - BASE_OPS: the program of K ops holds exactly
K - BASE_OPS more ops, each on the last one's output.

BASE_OPS is 1, not 0: a program of no ops copies its input into a new
output, which the program of K ops does not, so the difference of 0 and K
was K ops less a copy (at 64 MiB, most of an op). Both programs end in an
op that writes their output.

Both benchmarks time their programs in their steady state
(`time_in_steady_state`): each timed call right after an untimed call of the
same program, as a training loop runs its step, because what another program
leaves in the allocator (freed or kept pages, another footprint) changed the
next one's cost by up to 2.5x at 64 MiB (docs/PERFORMANCE.md).
"""

import time

import numpy as np

BASE_OPS = 1


def ops_per_program(nbytes):
    """K: enough chained ops that the difference to the program of BASE_OPS dominates its noise."""
    return BASE_OPS + int(np.clip((4 << 20) // nbytes, 2, 20))


def chained(op, ops):
    """A function applying `op` `ops` times, each to the last one's result."""
    def program(x):
        for _ in range(ops):
            x = op(x)
        return x
    return program


def per_op(seconds_of_k_ops, seconds_of_base, k):
    """Seconds per op from the times of the programs of k and BASE_OPS ops."""
    return (seconds_of_k_ops - seconds_of_base) / (k - BASE_OPS)


def time_in_steady_state(calls, rounds, before_timed=lambda: None):
    """Seconds of each of `rounds` timed calls of each of `calls` ({key: function of no arguments
    that waits for its result}): one call of each per round, in a new random order each round (the
    same sequence in every process), each timed call right after an untimed call of the same
    function and `before_timed()` (a barrier, across processes). {key: array over rounds}."""
    keys = list(calls)
    order = np.random.default_rng(0)
    times = np.zeros((rounds, len(keys)))
    for round_ in range(rounds):
        for i in order.permutation(len(keys)):
            calls[keys[i]]()
            before_timed()
            start = time.perf_counter()
            calls[keys[i]]()
            times[round_, i] = time.perf_counter() - start
    return {key: times[:, i] for i, key in enumerate(keys)}
