"""The persistent layer's split of hidden units over thread blocks, and its fit test."""

import dataclasses

import pytest

from jaxring.rnn.plan import A100, H100, DeviceBudget, plan_layer, split_units


@pytest.mark.parametrize("hidden, blocks", [(1, 1), (7, 3), (620, 66), (13, 13), (800, 132)])
def test_split_covers_every_unit_once_in_balanced_contiguous_runs(hidden, blocks):
    starts = split_units(hidden, blocks)
    runs = [range(a, b) for a, b in zip(starts, starts[1:])]
    assert len(runs) == blocks
    assert sorted(u for run in runs for u in run) == list(range(hidden))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1


def test_block_columns_are_each_gates_columns_of_its_units():
    plan = plan_layer(hidden=11, gates=3, batch=4, directions=2, weight_bytes=4,
                      device=DeviceBudget("six SMs", sms=6, shared_bytes_per_block=1 << 20))
    assert plan.blocks_per_direction == 3  # 6 SMs over 2 directions
    columns = [c for block in range(plan.blocks_per_direction) for c in plan.columns(block)]
    assert sorted(columns) == list(range(33))
    assert plan.columns(1) == [4, 5, 6, 7, 15, 16, 17, 18, 26, 27, 28, 29]


def test_ds2_paper_fits_hopper_and_ampere_in_both_dtypes():
    for weight_bytes, batch in [(2, 256), (2, 64), (4, 32)]:
        for device in (H100, A100):
            plan = plan_layer(620, 3, batch, 2, weight_bytes, device)
            assert not isinstance(plan, str), plan
            assert plan.blocks <= device.sms
            assert max(plan.forward_bytes, plan.backward_bytes) <= device.shared_bytes_per_block


def test_ds2_paper_at_bfloat16_batch_64_on_hopper_by_hand():
    # 66 blocks per direction on 132 SMs, 10 units each: forward 30 columns, padded to 32.
    plan = plan_layer(620, 3, 64, 2, 2, H100)
    assert (plan.blocks_per_direction, plan.max_units) == (66, 10)
    # The whole state (620 columns, padded to 624) is staged at once; 4 row tiles x 1 column group
    # leave 16 warps 4 splits of the depth: sums 4 x 64 x 32 float, weights 624 x (32 + 8) bfloat16,
    # the staged state 64 x (624 + 8) bfloat16.
    assert plan.forward_chunk == 624
    assert plan.forward_bytes == 4 * 64 * 32 * 4 + 624 * 40 * 2 + 64 * 632 * 2
    # Backward the depth is 1860 (padded 1872): two chunks of 944 columns, its 10 rows padded to 16,
    # the carried gradient 64 x 10 float.
    assert plan.backward_chunk == 944
    assert plan.backward_bytes == 4 * 64 * 16 * 4 + 16 * 1880 * 2 + 64 * 952 * 2 + 64 * 10 * 4


def test_chunks_narrow_until_the_layer_fits_and_cut_the_depth_evenly():
    roomy = plan_layer(620, 3, 256, 2, 2, DeviceBudget("roomy", sms=132, shared_bytes_per_block=1 << 30))
    assert (roomy.forward_chunk, roomy.backward_chunk) == (624, 1872)
    tight = plan_layer(620, 3, 256, 2, 2, H100)
    assert tight.forward_chunk < 624 and tight.backward_chunk < 1872
    for field, depth, bytes_of in [("forward_chunk", 624, lambda p: p.forward_bytes),
                                   ("backward_chunk", 1872, lambda p: p.backward_bytes)]:
        chunk = getattr(tight, field)
        pieces = -(-depth // chunk)
        assert chunk % 16 == 0 and chunk == -(-depth // 16 // pieces) * 16  # equal pieces of whole tiles
        wider = -(-depth // 16 // (pieces - 1)) * 16  # one piece fewer does not fit
        assert bytes_of(dataclasses.replace(tight, **{field: wider})) > H100.shared_bytes_per_block


def test_a_layer_too_large_for_the_chip_is_refused_with_the_reason():
    reason = plan_layer(4096, 3, 256, 2, 4, H100)
    assert isinstance(reason, str)
    assert "4096" in reason and "H100" in reason and "bytes per block" in reason


def test_nonsense_sizes_are_errors():
    with pytest.raises(ValueError, match="hidden must be at least 1"):
        plan_layer(0, 3, 4, 1, 4, H100)
