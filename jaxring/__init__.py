"""jaxring: synchronous data-parallel SGD for JAX with a ring all-reduce custom call."""

from jaxring._ffi import default_timeout, set_default_timeout
from jaxring.fusion import tree_allreduce
from jaxring.ring import all_gather, allreduce, reduce_scatter

__all__ = [
    "all_gather",
    "allreduce",
    "default_timeout",
    "reduce_scatter",
    "set_default_timeout",
    "tree_allreduce",
]
