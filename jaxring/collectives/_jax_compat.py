"""Every use of JAX internals (jax._src) in jaxring, in one place.

jaxring's primitive needs a few things JAX has no public API for: whether
shard_map is type-checking varying axes (check_vma), reading and setting the
varying axes of an abstract value, and the mesh behind the lowering context.
When JAX changes them, this module is the one to update.
"""

from jax._src import config as _config
from jax._src.sharding_impls import SPMDAxisContext


def checking_varying_axes() -> bool:
    """True inside jax.shard_map(check_vma=True), where avals carry their varying axes."""
    return _config._check_vma.value


def auto_pcast() -> bool:
    """True where JAX's collectives mark an input varying on their own before reducing it."""
    return _config.auto_pcast.value


def varying_axes(aval) -> frozenset:
    """The mesh axes over which `aval`'s value differs between devices."""
    return aval.mat.varying


def unreduced_or_reduced_axes(aval) -> frozenset:
    """The mesh axes over which `aval` is typed unreduced or reduced (explicit sharding)."""
    return aval.mat.unreduced | aval.mat.reduced


def with_shape_and_varying(aval, shape, varying):
    """`aval` with a new shape and set of varying axes."""
    return aval.update(shape=shape, manual_axis_type=aval.mat.update(varying=frozenset(varying)))


def spmd_mesh(lowering_context):
    """The device mesh of the pmap or shard_map being lowered, or None outside either."""
    axis_context = lowering_context.module_context.axis_context
    return axis_context.mesh if isinstance(axis_context, SPMDAxisContext) else None
