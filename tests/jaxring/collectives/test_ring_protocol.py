"""The device ring's synchronisation protocol (jaxring/collectives/csrc/core/ring_protocol.h) on host threads.

The GPU kernel and these threads run the same protocol code; only the flag
primitives differ (std::atomic release/acquire here), and the arithmetic is
the CPU handler's. Each (rank, lane) is a thread with random pauses before
every publish; results are checked against float64 numpy (ring) or numpy's
own rank-order float32 sum (one-shot and push, bitwise).
"""

import ml_dtypes
import numpy as np
import pytest

from jaxring.collectives import kinds
from tests.testing_modules import built_test_module

protocol = built_test_module("jaxring.collectives._jaxring_protocol")
# The handlers' values: these tests drive the compiled schedule and protocol directly.
ALLREDUCE, REDUCE_SCATTER, ALL_GATHER = (kinds.ALLREDUCE.mode, kinds.REDUCE_SCATTER.mode, kinds.ALL_GATHER.mode)

PATHS = ("ring", "one_shot", "push")
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float16), BFLOAT16]
# Unit roundoff of each output type; sums are accumulated in float32.
ROUNDOFF = {np.dtype(np.float32): 2.0**-24, BFLOAT16: 2.0**-8, np.dtype(np.float16): 2.0**-11,
            np.dtype(np.int32): 0.0}


def poison(dtype):
    return np.iinfo(np.int32).min if dtype == np.int32 else np.nan


def random_inputs(rng, dtype, calls, ranks, elements):
    if dtype == np.int32:
        return rng.integers(-1000, 1000, size=(calls, ranks, elements), dtype=np.int32)
    return rng.standard_normal((calls, ranks, elements)).astype(np.float32).astype(dtype)


def raw(array):
    """The array as the hook takes it: bfloat16 as its 16-bit words."""
    return array.view(np.uint16) if array.dtype == BFLOAT16 else array


def out_elements(mode, elements, ranks):
    return {ALLREDUCE: elements, REDUCE_SCATTER: elements // ranks, ALL_GATHER: elements * ranks}[mode]


def run(mode, path, inputs, *, lanes, reuse_buffers=False, slice_elements=7, max_delay_us=50,
        absent_rank=-1, absent_from_call=0, timeout_s=60.0, seed=0):
    calls, ranks, elements = inputs.shape
    outputs = np.full((calls, ranks, out_elements(mode, elements, ranks)), poison(inputs.dtype), inputs.dtype)
    errors = protocol.run_threads(mode, path, reuse_buffers, inputs.dtype.name, raw(inputs), raw(outputs), lanes,
                                  slice_elements, max_delay_us, absent_rank, absent_from_call, timeout_s, seed)
    return outputs, errors


def expected(mode, inputs):
    """float64 reference and allowed error, [calls, ranks, out_elements] each."""
    calls, ranks, elements = inputs.shape
    wide = inputs.astype(np.float64)
    if mode == ALL_GATHER:
        gathered = np.repeat(wide.reshape(calls, 1, ranks * elements), ranks, axis=1)
        return gathered, np.zeros_like(gathered)
    total, magnitude = wide.sum(axis=1), np.abs(wide).sum(axis=1)
    if mode == ALLREDUCE:
        total = np.repeat(total[:, None], ranks, axis=1)
        magnitude = np.repeat(magnitude[:, None], ranks, axis=1)
    else:
        total = total.reshape(calls, ranks, elements // ranks)
        magnitude = magnitude.reshape(calls, ranks, elements // ranks)
    return total, ROUNDOFF[inputs.dtype] * np.abs(total) + ranks * 2.0**-24 * magnitude


def assert_close(outputs, mode, inputs):
    reference, bound = expected(mode, inputs)
    error = np.abs(outputs.astype(np.float64) - reference)
    assert (error <= bound).all(), f"{int((~(error <= bound)).sum())} elements off (NaN: never written)"


def rank_order_sum(inputs):
    """Sum in rank order in the accumulation type, rounded once to the input type, as one-shot adds."""
    accumulator = np.int32 if inputs.dtype == np.int32 else np.float32
    total = inputs[:, 0].astype(accumulator)
    for p in range(1, inputs.shape[1]):
        total = total + inputs[:, p].astype(accumulator)
    return total.astype(inputs.dtype)


CASES = [
    (mode, ranks, elements, lanes, dtype)
    for mode in (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER)
    for ranks, elements, lanes in ((1, 5, 1), (2, 1, 2), (3, 2, 1), (4, 37, 3), (5, 101, 2), (8, 203, 2))
    for dtype in DTYPES
]


def padded(mode, ranks, elements):
    # reduce_scatter inputs are padded by the caller to equal chunks.
    return -(-elements // ranks) * ranks if mode == REDUCE_SCATTER else elements


# Buffers reused from call to call (as XLA reuses them) catch a rank that
# refills its buffers while a neighbour still reads them; fresh buffers per
# call let a fast rank run calls ahead.
@pytest.mark.parametrize("reuse_buffers", [False, True], ids=["fresh", "reused"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode,ranks,elements,lanes,dtype", CASES)
def test_many_calls_with_random_delays_match_float64_and_replicas_agree(reuse_buffers, path, mode, ranks,
                                                                        elements, lanes, dtype):
    rng = np.random.default_rng(ranks * 1000 + elements + mode)
    elements = padded(mode, ranks, elements)
    inputs = random_inputs(rng, dtype, 6, ranks, elements)
    outputs, errors = run(mode, path, inputs, lanes=lanes, reuse_buffers=reuse_buffers,
                          seed=int(rng.integers(1 << 30)))
    assert errors == [""] * (ranks * lanes)
    assert_close(outputs, mode, inputs)
    if mode == ALLREDUCE:
        for r in range(1, ranks):
            assert outputs[:, r].tobytes() == outputs[:, 0].tobytes(), f"rank {r} differs from rank 0"
    if path != "ring" and mode != ALL_GATHER:
        total = rank_order_sum(inputs)
        mine = total if mode == ALLREDUCE else None
        for r in range(ranks):
            if mode == REDUCE_SCATTER:
                chunk = elements // ranks
                mine = total[:, r * chunk:(r + 1) * chunk]
            assert outputs[:, r].tobytes() == mine.tobytes(), f"{path} is not the rank-order sum"


@pytest.mark.parametrize("path", PATHS)
def test_many_consecutive_calls_reuse_the_flags_without_reset(path):
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, np.float32, 200, 4, 67)
    outputs, errors = run(ALLREDUCE, path, inputs, lanes=3, reuse_buffers=True, slice_elements=5,
                          max_delay_us=5)
    assert errors == [""] * 12
    assert_close(outputs, ALLREDUCE, inputs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("absent_from_call", [0, 2])
def test_a_rank_that_never_arrives_times_out_naming_it(path, absent_from_call):
    rng = np.random.default_rng(3)
    ranks, lanes, absent = 4, 2, 2
    inputs = random_inputs(rng, np.float32, 4, ranks, 41)
    outputs, errors = run(ALLREDUCE, path, inputs, lanes=lanes, absent_rank=absent,
                          absent_from_call=absent_from_call, timeout_s=0.5)
    by_rank = [errors[r * lanes:(r + 1) * lanes] for r in range(ranks)]
    assert by_rank[absent] == [""] * lanes  # it stopped before the call, so it saw nothing go wrong
    # One-shot and push: everyone waits on it. Ring: its right neighbour's first
    # stage needs it; the others stall behind ranks that wait (their errors name those).
    waiting_on_it = [3] if path == "ring" else [0, 1, 3]
    for r in waiting_on_it:
        for error in by_rank[r]:
            assert f"rank {absent} never arrived" in error, error
            assert f"this is call {absent_from_call + 1}" in error
    for r in range(ranks):
        if r != absent:
            assert all(by_rank[r]), f"rank {r} finished a call rank {absent} never joined"
    assert_close(outputs[:absent_from_call], ALLREDUCE, inputs[:absent_from_call])


@pytest.mark.parametrize("dtype", (np.dtype(np.float16), BFLOAT16), ids=lambda d: d.name)
def test_16_bit_floats_convert_and_round_as_numpy_for_every_bit_pattern(dtype):
    """Every 16-bit pattern (subnormals, the largest finite values, infinities, NaNs) read into
    float32 and every rank-order sum rounded back once, against numpy's conversions: each
    pattern is added to a shuffled one, to itself negated (sums of zero, subnormal differences)
    and to a copy scaled by 1 + 2^-11 (sums that round, overflow to infinity at the top)."""
    patterns = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    shuffled = patterns[np.random.default_rng(21).permutation(1 << 16)]
    partners = (shuffled, -patterns, (patterns.astype(np.float32) * (1 + 2.0**-11)).astype(dtype))
    for partner in partners:
        inputs = np.stack([patterns, partner])[None]
        outputs, errors = run(ALLREDUCE, "push", inputs, lanes=1, max_delay_us=0)
        assert errors == [""] * 2
        with np.errstate(over="ignore", invalid="ignore"):  # infinities and NaNs are the point
            reference = rank_order_sum(inputs)[0]
        nan = np.isnan(reference.astype(np.float32))
        for out in outputs[0]:
            assert (np.isnan(out.astype(np.float32)) == nan).all(), "a NaN lost or made"
            assert (out.view(np.uint16)[~nan] == reference.view(np.uint16)[~nan]).all(), \
                f"{int((out.view(np.uint16)[~nan] != reference.view(np.uint16)[~nan]).sum())} sums differ from numpy's"


def test_bad_arguments_say_what_is_wrong():
    inputs = np.ones((1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16, float16 or int32, got 'float64'"):
        protocol.run_threads(ALLREDUCE, "ring", False, "float64", inputs, inputs.copy(), 1, 4, 0, -1, 0, 1.0, 0)
    with pytest.raises(ValueError, match="2-byte items for float16"):
        protocol.run_threads(ALLREDUCE, "ring", False, "float16", inputs, inputs.copy(), 1, 4, 0, -1, 0, 1.0, 0)
    with pytest.raises(ValueError, match="path must be ring, one_shot or push, got 'two_shot'"):
        protocol.run_threads(ALLREDUCE, "two_shot", False, "float32", inputs, inputs.copy(), 1, 4, 0, -1, 0, 1.0, 0)
    inputs = np.ones((1, protocol.MAX_RANKS + 1, 4), np.float32)
    with pytest.raises(ValueError, match="ranks must be"):
        protocol.run_threads(ALLREDUCE, "ring", False, "float32", inputs, inputs.copy(), 1, 4, 0, -1, 0, 1.0, 0)


# --- the one-shot path, brute force: every lane's flag operations and accesses ---

ONE_SHOT_CASES = [
    (mode, ranks, elements, lanes)
    for mode in (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER)
    for ranks in (1, 2, 3, 5)
    for elements in (0, 1, ranks - 1, ranks + 1, 13, 67)
    for lanes in (1, 2, 5)
]


@pytest.mark.parametrize("mode,ranks,elements,lanes", ONE_SHOT_CASES)
def test_one_shot_lanes_read_after_everyone_arrived_and_cover_the_output_once(mode, ranks, elements, lanes):
    elements = padded(mode, ranks, elements) if mode != ALLREDUCE else elements
    if mode == ALL_GATHER:
        elements = padded(REDUCE_SCATTER, ranks, elements)
    chunk = elements // ranks if mode != ALLREDUCE else None
    out_size = chunk if mode == REDUCE_SCATTER else elements
    for rank in range(ranks):
        written = np.zeros(out_size, int)
        for lane in range(lanes):
            events = protocol.record_one_shot(mode, elements, ranks, rank, lanes, lane)
            kinds = [e[0] for e in events]
            publishes = ranks
            # publish arrival to everyone, wait for everyone, data, publish done, wait for everyone
            assert kinds[:publishes] == ["publish"] * ranks
            assert [e[1:3] for e in events[:ranks]] == [(p, 0) for p in range(ranks)]
            assert [e[1:3] for e in events[ranks:2 * ranks]] == [(p, 0) for p in range(ranks)]
            assert kinds[ranks:2 * ranks] == ["wait"] * ranks
            data = events[2 * ranks:len(events) - 2 * ranks]
            tail = events[len(events) - 2 * ranks:]
            assert [e[:3] for e in tail] == [("publish", p, 1) for p in range(ranks)] + [("wait", p, 1) for p in range(ranks)]
            for kind, dst, source, src, n in data:
                if mode == ALL_GATHER:
                    assert kind == "copy" and dst == source * chunk + src, (dst, source, src)
                else:
                    assert kind == "sum" and source == ranks
                    begin = rank * chunk if mode == REDUCE_SCATTER else 0
                    assert src == begin + dst
                written[dst:dst + n] += 1
        assert (written == 1).all(), f"rank {rank}: elements written {written.tolist()}"

