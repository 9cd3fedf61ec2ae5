"""Which all-reduces sum in place, for operands of every kind and under every transformation.

An all-reduce's output takes its input's buffer where the program computed the
input (ring_primitive.py's _in_place, decided at every bind from the operand bound
there); over the program's own argument, a constant or a literal, or a
reshape of one, XLA would copy the input first, so it writes a fresh output.
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxring
from tests.jaxring.collectives.random_inputs import random_array

RANKS = 3


def in_place_calls(fn, x):
    """Whether each jaxring custom call of pmap(fn) over RANKS devices writes its output over its input."""
    hlo = jax.pmap(fn, "i", devices=jax.devices()[:RANKS]).lower(x).as_text()
    return [("output_operand_aliases" in line) for line in hlo.splitlines() if "custom_call @jaxring_ring" in line]


def test_an_allreduce_sums_in_place_exactly_the_values_the_program_computed():
    x = random_array(np.random.default_rng(41), (RANKS, 4, 6), jnp.float32)
    cases = {
        "a Python scalar": (lambda v: jaxring.allreduce(2.0, "i"), []),  # summed when traced, as lax does
        "a literal": (lambda v: jaxring.allreduce(jnp.asarray(np.float32(2.0)), "i"), [False]),
        "a captured constant": (lambda v: jaxring.allreduce(jnp.asarray(np.ones(6, np.float32)), "i"), [False]),
        "the argument": (lambda v: jaxring.allreduce(v, "i"), [False]),
        "a reshape of the argument": (lambda v: jaxring.allreduce(v.reshape(-1), "i"), [False]),
        "a computed value": (lambda v: jaxring.allreduce(v * 2, "i"), [True]),
        "vmap over the argument": (lambda v: jax.vmap(lambda r: jaxring.allreduce(r, "i"))(v), [False]),
        "vmap over a computed value": (lambda v: jax.vmap(lambda r: jaxring.allreduce(r * 2, "i"))(v), [True]),
        # the forward's operand is the argument; the backward's, the cotangent 2 * total, computed
        "grad": (lambda v: jax.grad(lambda w: (jaxring.allreduce(w, "i") ** 2).sum())(v), [False, True]),
        "a ring op's output": (lambda v: jaxring.allreduce(jaxring.all_gather(v, "i"), "i"), [False, True]),
    }
    got = {name: in_place_calls(fn, x) for name, (fn, _) in cases.items()}
    assert got == {name: want for name, (_, want) in cases.items()}
