"""The ring schedule the CPU and CUDA handlers share, checked by brute force.

For tiny rings, every pair of conflicting accesses (two stages touching the
same element of the same buffer, at least one writing) must be ordered by the
schedule's waits, so no interleaving the handlers may run can race; then one
symbolic execution shows every element ends up as the sum of each rank's
contribution exactly once.
"""

import itertools

import pytest

from jaxring.collectives import _ffi, kinds

# The handlers' values: these tests drive the compiled schedule and protocol directly.
ALLREDUCE, REDUCE_SCATTER, ALL_GATHER = (kinds.ALLREDUCE.mode, kinds.REDUCE_SCATTER.mode, kinds.ALL_GATHER.mode)

SEED, REDUCE_FIRST, REDUCE, REDUCE_LAST, COPY = range(5)


def schedules(mode, elements, ranks, slice_elements, align):
    module = _ffi.cpu_module()
    return [module.schedule(mode, elements, ranks, r, slice_elements, align) for r in range(ranks)]


def accesses(rank, ranks, stage, acc_is_out):
    """(reads, writes) of a stage: lists of (rank, buffer, element)."""
    kind, left_is_input, src, dst, count, _, _ = stage
    left = (rank - 1) % ranks
    acc = "out" if acc_is_out else "acc"
    own_in = [(rank, "in", src + e) for e in range(count)]
    reads = {
        SEED: own_in,
        REDUCE_FIRST: own_in + [(left, "in", src + e) for e in range(count)],
        REDUCE: own_in + [(left, acc, src + e) for e in range(count)],
        REDUCE_LAST: own_in + [(left, "in" if left_is_input else acc, src + e) for e in range(count)],
        COPY: [(left, "out", src + e) for e in range(count)],
    }[kind]
    target = acc if kind in (REDUCE_FIRST, REDUCE) else "out"
    writes = [(rank, target, dst + e) for e in range(count)]
    return reads, writes


def vector_clocks(plan):
    """Clock of each stage: how many stages of each rank happen before it (itself included)."""
    ranks = len(plan)
    clocks = {}
    pending = [0] * ranks
    while any(pending[r] < len(plan[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            i = pending[r]
            if i == len(plan[r]):
                continue
            wait_left, wait_right = plan[r][i][5], plan[r][i][6]
            left, right = (r - 1) % ranks, (r + 1) % ranks
            if pending[left] < wait_left or pending[right] < wait_right:
                continue
            clock = [0] * ranks
            for before in ([clocks[(r, i - 1)]] if i else []) + (
                [clocks[(left, wait_left - 1)]] if wait_left else []) + (
                [clocks[(right, wait_right - 1)]] if wait_right else []):
                clock = [max(a, b) for a, b in zip(clock, before)]
            clock[r] = i + 1
            clocks[(r, i)] = clock
            pending[r] += 1
            progressed = True
        assert progressed, "the schedule deadlocks"
    return clocks


def happens_before(clocks, a, b):
    return clocks[b][a[0]] >= a[1] + 1


CASES = [
    (mode, elements, ranks, slice_elements, align)
    for ranks in (1, 2, 3, 5)
    for mode in (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER)
    for elements in (0, 1, ranks - 1, 13)
    for slice_elements, align in ((100, 1), (2, 1), (4, 2))
    if mode == ALLREDUCE or align == 1
]


@pytest.mark.parametrize("mode,elements,ranks,slice_elements,align", CASES)
def test_conflicting_accesses_are_ordered_and_every_rank_gets_the_full_sum(mode, elements, ranks, slice_elements, align):
    if mode != ALLREDUCE:
        elements = -(-elements // ranks) * ranks  # the caller pads to equal chunks
    plan = schedules(mode, elements, ranks, slice_elements, align)
    assert len({len(p) for p in plan}) == 1, "ranks must run the same number of stages"
    clocks = vector_clocks(plan)
    for acc_is_out in ((True, False) if mode == ALLREDUCE else (False,)):
        touched = {}
        for r, i in clocks:
            reads, writes = accesses(r, ranks, plan[r][i], acc_is_out)
            for place in reads:
                touched.setdefault(place, []).append(((r, i), False))
            for place in writes:
                touched.setdefault(place, []).append(((r, i), True))
        for place, uses in touched.items():
            for (a, a_writes), (b, b_writes) in itertools.combinations(uses, 2):
                if (a_writes or b_writes) and a != b:
                    assert happens_before(clocks, a, b) or happens_before(clocks, b, a), (place, a, b)
        check_values(mode, elements, ranks, plan, clocks, acc_is_out)


def check_values(mode, elements, ranks, plan, clocks, acc_is_out):
    """Runs the stages in one order the waits allow, on symbolic values."""
    chunk = elements // ranks if mode != ALLREDUCE else None
    buffers = {}
    for r in range(ranks):
        if mode == ALL_GATHER:
            buffers[(r, "in")] = [(r * chunk + e, frozenset([r])) for e in range(chunk)]
        else:
            buffers[(r, "in")] = [(e, frozenset([r])) for e in range(elements)]
        buffers[(r, "out")] = {}
        buffers[(r, "acc")] = {}
    acc = "out" if acc_is_out else "acc"

    def add(a, b):
        assert a[0] == b[0] and not a[1] & b[1], "an element added to a different one, or twice"
        return (a[0], a[1] | b[1])

    for r, i in sorted(clocks, key=lambda s: sum(clocks[s])):
        kind, left_is_input, src, dst, count, _, _ = plan[r][i]
        left = (r - 1) % ranks
        for e in range(count):
            if kind == COPY:
                buffers[(r, "out")][dst + e] = buffers[(left, "out")][src + e]
                continue
            mine = buffers[(r, "in")][src + e]
            if kind == SEED:
                buffers[(r, "out")][dst + e] = mine
            else:
                from_input = kind == REDUCE_FIRST or (kind == REDUCE_LAST and left_is_input)
                theirs = buffers[(left, "in")][src + e] if from_input else buffers[(left, acc)][src + e]
                buffers[(r, acc if kind != REDUCE_LAST else "out")][dst + e] = add(mine, theirs)
    everyone = frozenset(range(ranks))
    for r in range(ranks):
        out = buffers[(r, "out")]
        if mode == REDUCE_SCATTER:
            expected = {e: (r * chunk + e, everyone) for e in range(chunk)}
        elif mode == ALL_GATHER:
            expected = {e: (e, frozenset([e // chunk])) for e in range(elements)}
        else:
            expected = {e: (e, everyone) for e in range(elements)}
        assert out == expected
