"""jaxring/engine/initial_state.py: what `init` returns is checked before the first step, with a message that
names what came back and what to return."""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from jaxring.engine.initial_state import checked_optimizer_state, checked_variables
from jaxring.engine.step import init_train_state
from tests.jaxring.engine.toy_task import ToyTask


class Returns(ToyTask):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def init(self, rng):
        return self.make(super().init(rng))


VARIABLES = ToyTask().init(jax.random.key(0))


def refusal(make) -> str:
    with pytest.raises(TypeError) as error:
        checked_variables(Returns(make), make(VARIABLES))
    return str(error.value)


def test_an_nnx_state_is_refused_before_the_first_step_with_what_to_return():
    with pytest.raises(TypeError) as error:
        init_train_state(Returns(lambda variables: nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))), optax.sgd(0.1), 0)
    message = str(error.value)
    assert message.startswith("Returns.init returned a flax.nnx.statelib.State with keys ['bias', 'kernel'], with no "
                              "'params'")
    assert "jaxring.engine.nnx_task.NNXTask" in message


def test_missing_params_are_refused_with_the_keys_that_came():
    message = refusal(lambda variables: {"weights": variables["params"], "stats": variables["stats"]})
    assert message.startswith("Returns.init returned a builtins.dict with keys ['stats', 'weights'], with no 'params'")


def test_a_typed_key_and_an_nnx_state_inside_are_named_by_path():
    message = refusal(lambda variables: {**variables, "rng": {"dropout": jax.random.key(0)},
                                         "nnx": nnx.state(nnx.BatchNorm(3, rngs=nnx.Rngs(0)))})
    assert "Returns.init returned variables a checkpoint cannot hold: " in message
    assert "['rng']['dropout']: a typed PRNG key (store its jax.random.key_data" in message
    assert "['nnx']: a flax.nnx.statelib.State, not an array" in message


def test_an_optimizer_state_a_checkpoint_cannot_hold_is_refused():
    with pytest.raises(TypeError, match=r"^the optimizer's initial state holds what a checkpoint cannot: "
                                        r"\['key'\]: a typed PRNG key"):
        checked_optimizer_state({"key": jax.random.key(0), "count": jnp.zeros((), jnp.int32)})


def test_a_checkpointable_state_passes():
    variables = {**VARIABLES, "n": {"count": jnp.zeros((), jnp.int32)},
                 "keys": [jax.random.key_data(jax.random.key(1))]}
    assert checked_variables(Returns(lambda v: v), variables) == variables
    assert checked_optimizer_state(optax.adam(0.1).init(variables["params"])) is not None
