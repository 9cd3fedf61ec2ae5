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
    plan = plan_layer(620, 3, 64, 2, 2, H100)
    # 4 runs of 16 utterances x 16 runs of 38-39 units: 64 of a direction's 66 SMs. Each block reads
    # a quarter of the state from L2 a frame, against the whole of it with 66 runs of units alone.
    assert (plan.batch_rows, plan.batch_groups, plan.unit_groups, plan.max_units) == (16, 4, 16, 39)
    # Forward: 1 row tile x 4 pairs of column tiles (117 columns padded to 128) leave 16 warps 4 splits
    # of the depth: sums 4 x 16 x 128 float, weights 624 x (128 + 8) bfloat16, the whole state's rows
    # staged at once, 16 x (624 + 8) bfloat16.
    assert plan.forward_chunk == 624
    assert plan.forward_bytes == 4 * 16 * 128 * 4 + 624 * 136 * 2 + 16 * 632 * 2
    # Backward the depth is 1860 (padded 1872), staged in three chunks of 624; the rows of 39 units
    # padded to 48 (3 column tiles: 2 groups, 8 splits); the carried gradient 16 x 39 float.
    assert plan.backward_chunk == 624
    assert plan.backward_bytes == 8 * 16 * 48 * 4 + 48 * 1880 * 2 + 16 * 632 * 2 + 16 * 39 * 4


def test_the_split_with_the_least_staging_is_chosen():
    chosen = plan_layer(620, 3, 64, 2, 2, H100)
    # The whole batch a block, 66 runs of units (it fits with chunks of 624 and 944).
    whole_batch = dataclasses.replace(chosen, batch_rows=64, starts=split_units(620, 66), forward_chunk=624,
                                      backward_chunk=944)
    assert whole_batch.backward_bytes <= H100.shared_bytes_per_block
    assert chosen.staging_cost < whole_batch.staging_cost
    # A batch under one tile is never split.
    assert plan_layer(620, 3, 15, 2, 2, H100).batch_groups == 1


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


@pytest.mark.parametrize("batch, hidden, sms", [(64, 620, 132), (256, 620, 132), (40, 13, 16), (3, 7, 4), (33, 10, 12)])
def test_blocks_cover_every_utterance_and_unit_once(batch, hidden, sms):
    device = DeviceBudget("test", sms=sms, shared_bytes_per_block=H100.shared_bytes_per_block)
    plan = plan_layer(hidden, 3, batch, 2, 2, device)
    assert not isinstance(plan, str), plan
    assert plan.blocks <= sms
    pairs = sorted((b, u) for block in range(plan.blocks_per_direction)
                   for b in plan.rows(block) for u in plan.units(block))
    assert pairs == [(b, u) for b in range(batch) for u in range(hidden)]
    assert plan.batch_rows == batch or plan.batch_rows % 16 == 0
