"""mpi4jax's ops in a program that queues: their order kept inside the program, no JAX ordered effect outside.

mpi4jax's ops carry a JAX ordered effect. JAX orders such programs on the
host: before it dispatches one, it waits until the previous one has finished
(jax/_src/array.py's token argument handler blocks on the last token; jax
0.10.2, mpi4jax 0.9.1). So a training loop whose step carries one cannot run
ahead of the step in flight, and JAX refuses the effect in a program over
more than one device.

`unordered(fn)` gives fn's mpi4jax calls a token of their own, made inside
the program: XLA runs them in the order fn makes them, and the program
carries no effect. What orders the calls of successive programs must then be
their data: the caller's to ensure. The training step's do (each step's
mean is an input of the next step's gradients: sync_mpi4jax.py).

One exception stays, XLA's, not JAX's: its CPU client runs a program of under
1000 flops (its cost analysis; an MPI call counts none) in the calling thread
when the program's inputs are ready, so there the host waits for the call.
A mean of at least 1000 gradient elements is never such a program.
"""

from __future__ import annotations

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from jaxring.collectives._jax_compat import ordered_effects

_call_p = Primitive("jaxring_mpi4jax_unordered")
_call_p.multiple_results = True
_call_p.def_impl(lambda *leaves, fn, out_avals, ordered: fn(*leaves))  # outside jit: mpi4jax's own, ordered
_call_p.def_abstract_eval(lambda *avals, fn, out_avals, ordered: out_avals)  # no effect


def _lowering(ctx, *leaves, fn, out_avals, ordered):
    own_tokens = ctx.replace(tokens_in=mlir.TokenSet.create(list(ordered)), tokens_out=None)
    return mlir.lower_fun(fn, multiple_results=True)(own_tokens, *leaves)  # the tokens out end here


mlir.register_lowering(_call_p, _lowering)


def unordered(fn):
    """fn (pytrees in and out, made of mpi4jax's ops and jax's) as one call that carries no JAX effect;
    fn's mpi4jax calls run in fn's order, each program's calls after its inputs are ready."""
    def call(*args):
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        out_trees = []

        def flat_fn(*flat):
            out_leaves, out_tree = jax.tree_util.tree_flatten(fn(*jax.tree_util.tree_unflatten(in_tree, flat)))
            out_trees.append(out_tree)
            return out_leaves

        traced = jax.make_jaxpr(flat_fn)(*[jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in leaves])
        ordered = ordered_effects(traced.effects)
        out = _call_p.bind(*leaves, fn=flat_fn, out_avals=tuple(traced.out_avals), ordered=ordered)
        return jax.tree_util.tree_unflatten(out_trees[0], out)
    return call
