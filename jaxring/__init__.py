"""jaxring: synchronous data-parallel SGD for JAX with a ring all-reduce custom call."""

import importlib

from jaxring.collectives.fusion import tree_allreduce
from jaxring.collectives.all_gather import all_gather
from jaxring.collectives.allreduce import allreduce
from jaxring.collectives.reduce_scatter import reduce_scatter
from jaxring.collectives.timeout import default_timeout, set_default_timeout
from jaxring.collectives.xla_threads import reserve_client_threads

# Before JAX makes its CPU client: steps queued over host devices need more of its threads than it
# would make (xla_threads.py).
reserve_client_threads()

# Importing mpi4py starts MPI, so the cross-process names load on first use.
_LAZY = {
    "World": "jaxring.collectives.topology",
    "init": "jaxring.collectives.topology",
    "initialize_jax_distributed": "jaxring.collectives.topology",
    "global_allreduce": "jaxring.collectives.global_ops",
    "broadcast": "jaxring.collectives.replicas",
    "replicas_consistent": "jaxring.collectives.replicas",
    "check_replicas": "jaxring.collectives.replicas",
    "ReplicasDivergedError": "jaxring.collectives.replicas",
    "ShardedUpdate": "jaxring.collectives.sharded_update",  # optax's import, for those who use it
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxring' has no attribute {name!r}")


__all__ = [
    "all_gather",
    "allreduce",
    "default_timeout",
    "reduce_scatter",
    "set_default_timeout",
    "tree_allreduce",
    *_LAZY,
]
