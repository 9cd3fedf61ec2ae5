"""The collectives the ring runs, one row each: every rule that differs between them reads this table.

The C++ side has its twin (TraitsOf in csrc/core/ring_schedule.h); the handlers' value for each
kind is read from the compiled module, and a kind either side lacks is an error at import.
Sizes are in elements of the ring's buffer, which the handlers call the full (all-reduced) one.
"""

import dataclasses

import jax
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from jaxring.collectives import _ffi, _jax_compat

# Types a value that is bitwise equal on every device of `names` (the all-gathered sum of
# mpi.py's leg, all_gather.py's invariant all_gather) as invariant over them, as lax.psum types
# its result; it moves nothing.
invariant_p = core.Primitive("jaxring_invariant")
# Moves axes between the states of explicit sharding's types (jax.lax.pcast's), moving nothing: an
# unreduced value's parts become the varying input of a ring's sum, a gathered value becomes reduced.
# Its transpose is the same move between the cotangents' states (a reduced value's is unreduced).
retyped_p = core.Primitive("jaxring_retyped")


# Compared and hashed by identity: each kind is one row of KINDS, and a primitive's params are hashed at every bind.
@dataclasses.dataclass(frozen=True, eq=False)
class Kind:
    name: str  # the public op, and the compiled module's key for it (MODES)
    lax_twin: str  # the jax.lax op whose signature, shapes and varying axes it has
    input_is_block: bool  # the input is this device's block of the ring's buffer (else the whole buffer)
    output_is_block: bool  # the output is this device's block of the reduced buffer (else the whole buffer)
    sums: bool  # adds the devices' inputs: lax.psum's rules on the input's varying axes apply
    invariant_output: bool  # every device gets the same value: typed invariant over the axes, as lax.psum's
    transpose: str  # the kind of its transpose where the cotangent may differ between devices
    mode: int  # the handlers' value for it

    def __repr__(self):  # as jaxprs print the primitive's params
        return self.name

    def ring_elements(self, in_elements: int, ranks: int) -> int:
        return in_elements * ranks if self.input_is_block else in_elements

    def out_elements(self, in_elements: int, ranks: int) -> int:
        full = self.ring_elements(in_elements, ranks)
        return full // ranks if self.output_is_block else full


def _table():
    modes = _ffi.modes()
    rows = (
        dict(name="allreduce", lax_twin="psum", input_is_block=False, output_is_block=False, sums=True,
             invariant_output=True, transpose="allreduce"),
        dict(name="reduce_scatter", lax_twin="psum_scatter", input_is_block=False, output_is_block=True, sums=True,
             invariant_output=False, transpose="all_gather"),
        dict(name="all_gather", lax_twin="all_gather", input_is_block=True, output_is_block=False, sums=False,
             invariant_output=False, transpose="reduce_scatter"),
    )
    if set(modes) != {row["name"] for row in rows}:
        raise ImportError(
            f"jaxring's compiled handlers run the collectives {sorted(modes)} but jaxring/collectives/kinds.py "
            f"describes {sorted(row['name'] for row in rows)}: rebuild the package, or describe the kind on both sides"
        )
    return {row["name"]: Kind(**row, mode=modes[row["name"]]) for row in rows}


KINDS = _table()
ALLREDUCE, REDUCE_SCATTER, ALL_GATHER = KINDS["allreduce"], KINDS["reduce_scatter"], KINDS["all_gather"]


def transpose_of(kind: Kind) -> Kind:
    return KINDS[kind.transpose]


def typed_input(flat, names, kind: Kind):
    """The ring's input under check_vma, as lax's op takes it before it reduces.

    lax.psum and psum_scatter take a value varying over all the reduced axes or
    over none (not unreduced or reduced ones: explicit sharding); under
    jax_auto_pcast every op marks the input varying over the reduced axes it
    is invariant over, so a value invariant over them counts once per device.
    """
    aval = jax.typeof(flat)
    missing = tuple(n for n in names if n not in _jax_compat.varying_axes(aval))
    if kind.sums:
        if _jax_compat.unreduced_or_reduced_axes(aval).intersection(names):
            # A sum of a value unreduced over all of `names` came typed varying (arguments.unreduced_as_varying).
            raise ValueError(
                f"jaxring.{kind.name} over {names} of a value typed {aval}, reduced or unreduced over some of "
                f"them: as lax.{kind.lax_twin}, it takes one varying over them, or (a sum) unreduced over all of "
                "them. A reduced value is already whole on every device; use it as it is, or mark it with "
                "jax.lax.pcast(x, axis_name, to='varying')"
            )
        if len(missing) not in (0, len(names)):
            raise ValueError(
                f"jaxring.{kind.name} over {names} of a value varying over some of them only ({aval}): "
                f"as lax.{kind.lax_twin}, it takes one that varies over all or none; mark it with "
                f"jax.lax.pcast(x, {missing}, to='varying')"
            )
    if missing and _jax_compat.auto_pcast():
        return jax.lax.pcast(flat, missing, to="varying")
    return flat


def output_varying(x, kind: Kind, axis_name) -> frozenset:
    """The varying axes of the output, by lax's rules (psum_invariant, psum_scatter, all_gather)."""
    if not _jax_compat.checking_varying_axes():
        return frozenset()
    varying = _jax_compat.varying_axes(x)
    if kind.invariant_output:
        if not varying.intersection(axis_name):
            raise ValueError(
                f"jaxring.{kind.name} over {axis_name} of a value that does not vary over any of "
                f"them (it varies over {set(varying) or 'nothing'}): as with lax.{kind.lax_twin}, mark it "
                "varying first with jax.lax.pcast(x, axis_name, to='varying')"
            )
        return varying - frozenset(axis_name)
    if not varying.issuperset(axis_name):
        raise ValueError(
            f"jaxring.{kind.name} over {axis_name} needs a value varying over all of them (as "
            f"lax.{kind.lax_twin}), got one varying over {set(varying) or 'nothing'}; mark it with "
            "jax.lax.pcast(x, axis_name, to='varying') or pass check_vma=False to jax.shard_map"
        )
    return varying  # each device still holds its own block


def _invariant_abstract_eval(x, *, names):
    return _jax_compat.with_shape_and_varying(x, x.shape, _jax_compat.varying_axes(x) - frozenset(names))


def _invariant_transpose(cotangent, x, *, names):
    # As lax.psum's typed transpose: every device's input receives the cotangent whole.
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [jax.lax.pcast(cotangent, names, to="varying")]


invariant_p.def_abstract_eval(_invariant_abstract_eval)
ad.deflinear2(invariant_p, _invariant_transpose)
batching.primitive_batchers[invariant_p] = lambda args, dims, names: (invariant_p.bind(*args, names=names), dims[0])
mlir.register_lowering(invariant_p, lambda ctx, x, **_: [x])


def retyped(x, names, from_state, to_state):
    """`x` with the axes `names` moved from type state `from_state` to `to_state` (retyped_p)."""
    return retyped_p.bind(x, names=tuple(names), from_state=from_state, to_state=to_state)


_COTANGENT_STATE = {"varying": "varying", "reduced": "unreduced", "unreduced": "reduced"}


def _retyped_abstract_eval(x, *, names, from_state, to_state):
    if not _jax_compat.axes_in_state(x, from_state).issuperset(names):
        raise ValueError(f"jaxring: a value typed {x.str_short(True)} is not {from_state} over {names}")
    return _jax_compat.with_axes_moved(x, names, from_state, to_state)


def _retyped_transpose(cotangent, x, *, names, from_state, to_state):
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [retyped(cotangent, names, _COTANGENT_STATE[to_state], _COTANGENT_STATE[from_state])]


retyped_p.def_abstract_eval(_retyped_abstract_eval)
ad.deflinear2(retyped_p, _retyped_transpose)
batching.primitive_batchers[retyped_p] = lambda args, dims, **params: (retyped_p.bind(*args, **params), dims[0])
mlir.register_lowering(retyped_p, lambda ctx, x, **_: [x])
