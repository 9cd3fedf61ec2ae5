"""The persistent layer's split of hidden units over thread blocks, and its fit test."""

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


def test_ds2_paper_fits_hopper_in_both_dtypes_and_ampere_in_bfloat16():
    for weight_bytes, batch, devices in [(2, 256, (H100, A100)), (2, 64, (H100, A100)), (4, 32, (H100,))]:
        for device in devices:
            plan = plan_layer(620, 3, batch, 2, weight_bytes, device)
            assert not isinstance(plan, str), plan
            assert plan.blocks <= device.sms
    # 54 blocks per direction on 108 SMs: 12 units, 620 x 36 x (4 + 4) bytes backward, over 163 KiB.
    assert "180096 bytes" in plan_layer(620, 3, 32, 2, 4, A100)
    # By hand: 66 blocks per direction on 132 SMs, 10 units each, bfloat16 at batch 256:
    # weights 620 x 30 x 2 + accumulators 256 x 30 x 4 forward; rows and float32 gradient backward.
    plan = plan_layer(620, 3, 256, 2, 2, H100)
    assert (plan.blocks_per_direction, plan.max_units) == (66, 10)
    assert plan.forward_bytes == 620 * 30 * 2 + 256 * 30 * 4
    assert plan.backward_bytes == 620 * 30 * 6 + 256 * 10 * 4


def test_a_layer_too_large_for_the_chip_is_refused_with_the_reason():
    reason = plan_layer(4096, 3, 256, 2, 4, H100)
    assert isinstance(reason, str)
    assert "4096" in reason and "H100" in reason and "bytes per block" in reason


def test_nonsense_sizes_are_errors():
    with pytest.raises(ValueError, match="hidden must be at least 1"):
        plan_layer(0, 3, 4, 1, 4, H100)
