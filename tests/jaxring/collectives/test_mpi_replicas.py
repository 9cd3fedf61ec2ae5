"""broadcast and the replica checks in one process (the multi-process cases run in test_mpi.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxring.collectives import replicas


def replicated(row):
    """`row` on every local device, laid out as pmap keeps parameters."""
    devices = jax.local_devices()
    mesh = Mesh(devices, ("d",))
    return jax.device_put(np.repeat(row[None], len(devices), 0), NamedSharding(mesh, P("d")))


def test_broadcast_in_a_world_of_one_keeps_values_and_layout():
    tree = {"w": replicated(np.arange(6, dtype=np.float32)), "step": np.int32(3), "lr": 0.5}
    out = replicas.broadcast(tree)
    assert out["w"] is tree["w"]
    assert out["step"] == 3 and out["step"].dtype == np.int32
    assert out["lr"] == 0.5


def test_broadcast_rejects_a_root_outside_the_world():
    with pytest.raises(ValueError, match=r"root must be a rank in \[0, 1\)"):
        replicas.broadcast({"w": np.zeros(2)}, root=1)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8, jnp.bool_])
def test_equal_device_copies_are_consistent(dtype):
    row = (np.random.default_rng(0).standard_normal(37) > 0).astype(dtype)
    tree = {"w": replicated(row), "host": np.asarray(row)}
    assert replicas.replicas_consistent(tree)
    replicas.check_replicas(tree)


@pytest.mark.parametrize("position", [0, 17, 36])
def test_a_single_flipped_bit_on_one_device_is_named(position):
    params = replicated(np.random.default_rng(1).standard_normal(37).astype(np.float32))
    rows = [shard.data for shard in params.addressable_shards]
    bits = np.asarray(rows[5]).view(np.uint32).copy()
    bits[0, position] ^= 1
    rows[5] = jax.device_put(bits.view(np.float32), rows[5].devices().pop())
    drifted = jax.make_array_from_single_device_arrays(params.shape, params.sharding, rows)
    tree = {"layer": {"kernel": drifted}}
    assert not replicas.replicas_consistent(tree)
    device = params.addressable_shards[5].device.id
    with pytest.raises(replicas.ReplicasDivergedError, match=rf"\['layer'\]\['kernel'\]: rank 0 device {device} differ from the 7 copies"):
        replicas.check_replicas(tree)
