"""The plans of the MPI legs a lowering registers (csrc/mpi/leg_plan.h): what each lowered leg does
(tag, algorithm, dtype, ...), which its custom call carries only as a plan's id."""

from jaxring.collectives import mpi


def plans_registered_by(lower) -> list:
    """The plans (dicts: _jaxring_mpi.leg_plan) that calling `lower()` registered, in lowering order."""
    module = mpi._leg_module()
    first = module.leg_plan_count()
    lower()
    return [module.leg_plan(i) for i in range(first, module.leg_plan_count())]
