"""Which devices a process drives, for each layout of processes on a node."""

import dataclasses

import pytest

from jaxring.collectives.topology import devices_for_process


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    platform: str


def devices(n, platform="gpu"):
    return [FakeDevice(i, platform) for i in range(n)]


def test_one_process_per_node_drives_every_device():
    assert devices_for_process(devices(8), 0, 1) == tuple(devices(8))


def test_one_process_per_gpu_drives_its_own():
    assert [devices_for_process(devices(4), r, 4) for r in range(4)] == [(d,) for d in devices(4)]


def test_processes_split_the_gpus_evenly_in_local_rank_order():
    assert devices_for_process(devices(8), 1, 2) == tuple(devices(8)[4:])


def test_a_process_restricted_to_one_gpu_drives_it():
    # e.g. CUDA_VISIBLE_DEVICES set per local rank
    assert devices_for_process(devices(1), 3, 4) == tuple(devices(1))


def test_each_process_drives_its_own_host_devices():
    assert devices_for_process(devices(2, "cpu"), 2, 3) == tuple(devices(2, "cpu"))


def test_uneven_split_is_explained():
    with pytest.raises(ValueError, match="3 processes on this node cannot share its 4 gpu devices"):
        devices_for_process(devices(4), 0, 3)


def test_a_communicators_devices_are_the_worlds_once_it_is_joined():
    """devices_among, which a communicator's members call without the job: this process' own
    devices, found over `comm` alone before jaxring.init and the World's after."""
    import jax
    from mpi4py import MPI

    from jaxring.collectives import topology

    assert topology.devices_among(MPI.COMM_SELF) == tuple(jax.local_devices())
    assert topology.devices_among(MPI.COMM_SELF) == topology.init().local_devices
