"""The cross-process leg lowers for CUDA (csrc/mpi/cuda_mpi_ring.cc) as for CPU; no GPU needed to lower.

The handler itself has not run on a GPU: these check what can be checked here,
that the leg's CUDA lowering emits the same custom call as the CPU one and that
a build without the CUDA handler refuses clearly.
"""

import re
import types

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from jaxring.collectives import mpi, topology
from tests.jaxring.collectives.leg_plans import plans_registered_by


def _lowered(platform, shape):
    """reduce_over_processes over this process' devices lowered for `platform`, as text."""
    devices = topology.init().local_devices
    mesh = Mesh(np.array(devices), ("i",))
    def sum_(v):
        return mpi.reduce_over_processes(v, ("i",), mpi.lax_local_ops(("i",)), 0, "test leg")

    leg = jax.jit(jax.shard_map(sum_, mesh=mesh, in_specs=P("i"), out_specs=P()))
    x = np.random.default_rng(1).standard_normal((len(devices), *shape)).astype(np.float32)
    return leg.trace(x).lower(lowering_platforms=(platform,)).as_text()


def _leg_calls(platform, shape):
    """The MPI leg's custom-call lines of _lowered(platform, shape), and the plans
    (csrc/mpi/leg_plan.h) the lowering registered."""
    texts = []
    plans = plans_registered_by(lambda: texts.append(_lowered(platform, shape)))
    return [line.strip() for line in texts[0].splitlines() if "custom_call @jaxring_mpi_ring" in line], plans


def test_the_cuda_lowering_emits_the_cpu_leg():
    if "CUDA" not in mpi._leg_module().registrations():
        pytest.skip("jaxring was built without a CUDA toolkit: the leg has no CUDA handler to lower to")
    (cpu,), (cpu_plan,) = _leg_calls("cpu", (3, 7))
    (cuda,), (cuda_plan,) = _leg_calls("cuda", (3, 7))
    assert "has_side_effect = true" in cpu and "has_side_effect = true" in cuda
    # The same plan but for the tag, which each lowering takes in turn; on CPU the plan's id is an
    # operand (a constant), on CUDA an attribute (an operand would be in device memory).
    assert {**cpu_plan, "tag": None} == {**cuda_plan, "tag": None} and cpu_plan["what"] == "test leg"
    assert re.search(r"custom_call @jaxring_mpi_ring\(%\S+, %\S+\)", cpu) and "plan =" not in cpu, cpu
    assert re.search(r"custom_call @jaxring_mpi_ring\(%\S+\)", cuda) and "plan = " in cuda, cuda


def test_a_build_without_the_cuda_handler_refuses_to_lower_for_cuda(monkeypatch):
    cpu_only = types.SimpleNamespace(
        TARGET_NAME=mpi._leg_module().TARGET_NAME, registrations=lambda: {"cpu": object()}
    )
    monkeypatch.setattr(mpi, "_leg_module", lambda: cpu_only)
    with pytest.raises(NotImplementedError, match="built without its CUDA handler"):
        _lowered("cuda", (5,))
