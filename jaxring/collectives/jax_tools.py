"""jaxring's collectives in JAX's own tools, as lax's collectives are.

jax.experimental.roofline: `ring_p` reports the bytes per mesh axis that roofline's rules for
lax's ring collectives report for the same input (psum's for allreduce, psum_scatter's,
all_gather's; asked through _jax_compat.py). With axis_index_groups the bytes are the whole
axis', as lax's rules ignore groups too. The typing primitives that move nothing (kinds.py's
invariant_p and retyped_p) cost what roofline's standard rule says, as lax's pvary does.

Checkpoint policies (jax.checkpoint, jax.checkpoint_policies) name no collective in JAX 0.10.2:
they decide by primitive (dot_general, the `name` of checkpoint_name) or save everything or
nothing, so a policy treats ring_p as it treats lax.psum, and there is nothing to hook
(docs/COLLECTIVES.md).
"""

import jax.experimental.roofline as roofline

from jaxring.collectives import _jax_compat


def _roofline(ctx, *args, params):
    # A vmap axis never reaches the program roofline reads: ring_primitive.py's batching rule took it out.
    return _jax_compat.lax_roofline_rules()[params.kind.lax_twin](ctx, *args, axes=tuple(params.axis_name))


def register(ring_p, *typing_primitives):
    roofline.register_roofline(ring_p)(_roofline)
    for primitive in typing_primitives:
        roofline.register_standard_roofline(primitive)
