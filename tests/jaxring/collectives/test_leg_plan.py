"""The MPI leg's plans (csrc/mpi/leg_plan.h), in one process: what a lowering registers, the id its
call carries, the refusals at registration and at the call. Several processes: test_mpi.py."""

import re

import jax
import numpy as np
import pytest

from jaxring.collectives import _ffi, mpi, topology
from tests.jaxring.collectives.leg_plans import plans_registered_by


def _sum_over_processes(what, timeout_ms=0):
    return jax.jit(lambda v: mpi.reduce_over_processes(v, (), mpi.lax_local_ops(()), timeout_ms, what))


def test_a_lowering_registers_the_plan_its_call_names_and_the_call_runs():
    topology.init()
    x = np.random.default_rng(3).standard_normal(37).astype(np.float32)
    texts = []
    leg = _sum_over_processes("plan test", timeout_ms=1234)
    (plan,) = plans_registered_by(lambda: texts.append(leg.lower(x).as_text()))
    assert plan["what"] == "plan test" and plan["dtype"] == "float32" and plan["timeout_ms"] == 1234
    assert plan["algorithm"] == mpi._leg_module().ALGORITHMS["one-shot"]
    assert plan["reduction"] == _ffi.reductions()["sum"] and plan["mode"] == _ffi.modes()["allreduce"]
    (call,) = [line for line in texts[0].splitlines() if "custom_call @jaxring_mpi_ring" in line]
    operand = re.search(r"custom_call @jaxring_mpi_ring\(%\S+, (%\S+)\)", call).group(1)
    (constant,) = [line for line in texts[0].splitlines() if line.strip().startswith(f"{operand} = ")]
    assert re.search(r"dense<(\d+)> : tensor<i32>", constant).group(1) == str(mpi._leg_module().leg_plan_count() - 1)
    assert np.array_equal(np.asarray(leg(x)), x)  # one process: its own buffer is the sum


@pytest.mark.parametrize(
    "change, refused",
    [
        (dict(dtype="complex64", reduction=_ffi.reductions()["max"]), "complex numbers have no order"),
        (dict(dtype="float32", algorithm=1, mode=_ffi.modes()["reduce_scatter"]), "around the ring"),
        (dict(dtype="float32", algorithm=7), "got algorithm 7"),
        (dict(dtype="float32", comm_id=10**6), "no MPI communicator 1000000"),
    ],
)
def test_registration_refuses_what_the_leg_cannot_run_naming_it(change, refused):
    topology.init()
    mpi._job()
    args = dict(comm_id=0, dtype="float32", reduction=0, tag=5, timeout_ms=0, what="the refused leg",
                algorithm=0, piece_elements=64, mode=0)
    before = mpi._leg_module().leg_plan_count()
    with pytest.raises(ValueError, match=refused) as error:
        mpi._leg_module().register_leg(**{**args, **change})
    assert "the refused leg" in str(error.value)
    assert mpi._leg_module().leg_plan_count() == before


def test_a_call_naming_no_plan_or_another_type_fails_saying_so():
    topology.init()
    mpi._job()
    x = np.arange(5, dtype=np.float32) + 0.5
    call = jax.ffi.ffi_call(mpi._leg_module().TARGET_NAME, jax.ShapeDtypeStruct(x.shape, x.dtype), has_side_effect=True)
    with pytest.raises(Exception, match="no leg across processes has plan 99999999"):
        jax.block_until_ready(jax.jit(call)(x, np.int32(99_999_999)))
    plan = mpi._leg_module().register_leg(comm_id=0, dtype="int32", reduction=0, tag=6, timeout_ms=0,
                                          what="an int32 leg", algorithm=1, piece_elements=64, mode=0)
    with pytest.raises(Exception, match=r"\(an int32 leg\) was lowered for int32 and got another type"):
        jax.block_until_ready(jax.jit(call)(x, np.int32(plan)))
