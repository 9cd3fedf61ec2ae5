"""The device engine's host side (csrc/cuda/device_engine.*) over a fake CUDA (csrc/testing/module_engine_test.cc).

Ranks are host threads calling the engine as XLA's handler threads do; the
fake records every CUDA call and keeps each launch's kernel arguments.
"""

import itertools

import pytest

from tests.testing_modules import built_test_module

engine_test = built_test_module("jaxring.collectives._jaxring_engine_test")

Fake = engine_test.Fake
_op_ids = itertools.count(1)


def op():
    return next(_op_ids)


def outcomes(results):
    return {outcome for call in results for outcome, _ in call}


def test_devices_are_prepared_once_before_the_first_launch():
    fake = Fake(4, links={(0, 1): "pcie", (1, 0): "pcie", (2, 3): "none", (3, 2): "none"})
    assert outcomes(fake.run(op(), [1, 2], calls=2)) == {"launched"}
    assert outcomes(fake.run(op(), [0, 2, 3], calls=2)) == {"host engine"}  # 2 and 3 cannot map each other
    assert outcomes(fake.run(op(), [2, 1], calls=2)) == {"launched"}
    calls = fake.cuda_calls()
    assert not [c for c in calls if "after a launch" in c], calls
    pool_bytes = 64 * engine_test.POOL_SLOT_BYTES
    for device in range(4):
        assert calls.count(f"load_kernels {device}") == 1
        assert calls.count(f"alloc_device {device} {pool_bytes}") == 1
    # The failure records and the words in which kernels report their calls finished.
    assert sum(c.startswith("alloc_mapped") for c in calls) == 2
    # Peer access wherever there is a link, PCIe too (the host-staged engine uses it), never later.
    enabled = {tuple(map(int, c.split()[1:])) for c in calls if c.startswith("enable_peer")}
    assert enabled == {(a, b) for a in range(4) for b in range(4) if a != b} - {(2, 3), (3, 2)}


def test_ranks_agree_on_epochs_flag_blocks_and_buffers():
    fake = Fake(3)
    first, second = op(), op()
    fake.run(first, [0, 1, 2], elements=100003, calls=4)
    launches = fake.launches()
    assert sorted((l["epoch"], l["rank"]) for l in launches) == [(e, r) for e in range(1, 5) for r in range(3)]
    # The ranks of a call agree on its flag blocks, one per rank; a rank a call ahead of a peer still
    # leaving the last meeting gets a second session, so at most two sets serve the four calls.
    by_epoch = {}
    for l in launches:
        by_epoch.setdefault(l["epoch"], set()).add(tuple(l["flag_blocks"]))
    assert all(len(sets) == 1 for sets in by_epoch.values()), by_epoch
    blocks = {next(iter(sets)) for sets in by_epoch.values()}
    assert 1 <= len(blocks) <= 2 and all(len(set(b)) == 3 for b in blocks)
    assert {tuple(l["inputs"]) for l in launches} == {tuple(engine_test.input_address(r) for r in range(3))}
    for block in blocks:
        for rank in range(3):
            mine = sorted((l for l in launches if l["rank"] == rank and tuple(l["flag_blocks"]) == block),
                          key=lambda l: l["epoch"])
            # The count of finished blocks grows by the call's lanes, in the rank's own block.
            lanes = [l["lanes"] for l in mine]
            assert [l["blocks_done_after"] for l in mine] == list(itertools.accumulate(lanes))
            assert {l["blocks_done"] for l in mine} <= {block[rank] + 8 * 256}
    fake.run(second, [0, 1, 2], calls=1)
    other = fake.launches()
    assert {l["epoch"] for l in other} == {1}
    assert not set(other[0]["flag_blocks"]) & {b for block in blocks for b in block}


@pytest.mark.parametrize("links, any_link, expected, reason", [
    ({}, False, "launched", "device-synchronised engine"),
    ({(0, 1): "pcie", (1, 0): "pcie"}, False, "host engine", "linked over PCIe only"),
    ({(0, 1): "pcie", (1, 0): "pcie"}, True, "launched", "device-synchronised engine"),
    ({(1, 0): "none"}, True, "host engine", "device 1 cannot map device 0"),
])
def test_engine_choice_by_link_and_logged_once_per_ring(links, any_link, expected, reason):
    fake = Fake(2, links=links, any_link=any_link)
    ring = op()
    assert outcomes(fake.run(ring, [0, 1], calls=3)) == {expected}
    log = fake.engine_log()
    assert len(log) == 1 and f"op {ring} group 0 on devices [0, 1]" in log[0] and reason in log[0], log


def test_more_ranks_than_the_device_engine_takes_use_the_host_engine():
    fake = Fake(17)
    assert outcomes(fake.run(op(), list(range(17)))) == {"host engine"}
    assert "more than 16 ranks" in fake.engine_log()[0]


def test_a_device_timeout_fails_the_next_call_of_any_op_on_every_rank():
    fake = Fake(3)
    devices = [0, 1, 2]
    first, second = op(), op()
    fake.fail_on_device(1, 2, 0)  # rank 1's kernel of call 2 gives up waiting for rank 0
    assert outcomes(fake.run(first, devices, calls=2)) == {"launched"}
    fake.launches()
    # The next call, of another op on the same devices, fails on every rank at once, naming rank 1.
    results = fake.run(second, devices, timeout_ms=600000)[0]
    for outcome, error in results:
        assert outcome == "failed"
        assert "rank 1 reports that its previous call timed out on the device (its output was poisoned)" in error
        assert "rank 0 never arrived (its last word is from call 1, this is call 2)" in error
    assert fake.launches() == []
    # Reported once: the call after runs, with the epochs still agreed.
    assert outcomes(fake.run(second, devices)) == {"launched"}
    assert {l["epoch"] for l in fake.launches()} == {2}


def test_take_failure_reports_and_forgets():
    fake = Fake(2)
    ring = op()
    fake.fail_on_device(0, 1, 1)
    fake.run(ring, [0, 1])
    assert "jaxring device ring: rank 0 timed out on the device" in fake.take_failure(ring, [0, 1], 0)
    assert fake.take_failure(ring, [0, 1], 0) == ""
    assert fake.take_failure(ring, [0, 1], 1) == ""
    assert outcomes(fake.run(ring, [0, 1])) == {"launched"}


def test_a_buffer_a_peer_cannot_map_fails_every_rank_before_any_launch():
    fake = Fake(3)
    good, bad = op(), op()
    assert outcomes(fake.run(good, [0, 1, 2], calls=3)) == {"launched"}
    fake.launches()
    # Each rank checks its buffers once against every peer device, then remembers them.
    assert fake.pointer_queries() == 3 * 2 * 2  # ranks x (input, output) x peers
    fake.unreadable(engine_test.input_address(2), 0)
    for outcome, error in fake.run(bad, [1, 0, 2])[0]:
        assert outcome == "failed"
        assert (f"rank 2 reports that its buffer {hex(engine_test.input_address(2))} on device 2 cannot be read "
                "by device 0 (fake: not mapped)") in error
        assert "XLA_PYTHON_CLIENT_ALLOCATOR=default" in error
    assert fake.launches() == []


def test_one_op_on_two_device_sets_is_refused():
    fake = Fake(4)
    ring = op()
    assert outcomes(fake.run(ring, [0, 1])) == {"launched"}
    for outcome, error in fake.run(ring, [2, 3])[0]:
        assert outcome == "failed"
        assert f"op {ring} group 0 first ran on devices [0, 1] and now on [2, 3]" in error


def test_a_rank_that_never_arrives_fails_its_peers_and_later_executions_go_on():
    fake = Fake(3)
    ring = op()
    results = fake.run(ring, [0, 1, 2], timeout_ms=200, absent_rank=2, run_ids=[5, 5, 5])[0]
    for rank in (0, 1):
        assert results[rank][0] == "failed"
        error = results[rank][1]
        assert f"op {ring} in execution 5 (call 1 of this op there): rank " in error  # whichever gave up first
        assert "timed out waiting for rank(s) [2] that never arrived (rank 2 never called this op)" in error
    assert fake.launches() == []
    # Rank 2 comes late to execution 5: it fails at once, launching nothing.
    late = fake.run(ring, [0, 1, 2], timeout_ms=200, run_ids=[6, 6, 5])[0]
    assert late[2][0] == "failed" and "rank(s) [2] that never arrived" in late[2][1]
    assert [l["rank"] for l in fake.launches()] == []  # ranks 0 and 1 waited in vain for rank 2 in execution 6
    assert all("execution 6" in error for _, error in late[:2])
    assert outcomes(fake.run(ring, [0, 1, 2], run_ids=[7, 7, 7])) == {"launched"}


def test_the_session_of_a_failed_meeting_serves_again_once_its_late_rank_has_left():
    fake = Fake(3, pool_slots=1)  # one session per ring
    ring = op()
    results = fake.run(ring, [0, 1, 2], timeout_ms=200, run_ids=[5, 5, 5], late_rank=2)[0]
    assert [outcome for outcome, _ in results] == ["failed"] * 3
    assert outcomes(fake.run(ring, [0, 1, 2], timeout_ms=2000, run_ids=[6, 6, 6])) == {"launched"}


def test_a_used_up_flag_pool_is_a_clear_error():
    fake = Fake(2, pool_slots=2)
    first = op()
    assert outcomes(fake.run(first, [0, 1])) == {"launched"}
    assert outcomes(fake.run(op(), [1, 0])) == {"launched"}
    results = fake.run(op(), [0, 1], timeout_ms=200)[0]
    assert any("pool of 2 ring flag blocks is used up" in error for _, error in results), results
    # Rings that have a session reuse it once its kernels finished, with no block from the pool.
    assert outcomes(fake.run(first, [0, 1], calls=3, run_ids=[9, 9])) == {"launched"}


def test_a_failed_preparation_is_reported_on_every_call():
    fake = Fake(2)
    fake.fail_setup("load_kernels")
    for _ in range(2):
        for outcome, error in fake.run(op(), [0, 1])[0]:
            assert outcome == "failed"
            assert error == "jaxring device ring: preparing the devices failed: fake: no kernel image for this device"


@pytest.mark.parametrize("elements, one_shot", [(1000, True), (1001, False)])
def test_one_shot_up_to_the_threshold(elements, one_shot):
    fake = Fake(2, one_shot_max_bytes=4000)
    fake.run(op(), [0, 1], elements=elements)
    assert {l["one_shot"] for l in fake.launches()} == {one_shot}
