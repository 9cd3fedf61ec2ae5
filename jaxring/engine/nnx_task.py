"""A Flax NNX model as a task: the engine's init, loss and predict (jaxring/engine/task.py) from an nnx.Module.

Subclass NNXTask and write, besides the data and metric methods every task has
(score, summarize, train_batches, eval_batches, metrics):

    def create_model(self, rngs: nnx.Rngs) -> nnx.Module   # e.g. MyModel(rngs=rngs)
    def model_loss(self, model, batch) -> jax.Array        # training mode: the mean loss of the device batch
    def model_predict(self, model, batch)                  # evaluation mode: outputs with a leading batch axis

The engine never sees the module. The model's state is split into its
nnx.Param part (the engine's "params": differentiated, optimized) and
everything else (the collection STATE: BatchNorm's statistics, RNG streams'
keys and counts), each as a pure dict of arrays, so checkpoints hold nested
dicts as with linen; a PRNG key is held as its key data (uint32). The loss
merges them into the model (`model.train()`), runs model_loss, and splits the
updated state out again: BatchNorm's statistics are averaged over the replicas
and counts kept (jaxring/engine/model_state.py). Every replica sees each RNG
stream's key with the engine's key of its step and replica folded in, so each
device draws its own dropout masks from train.seed, and the stored key stays
the same on all of them (the count advances alike), so a checkpoint resumes
the same streams.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

STATE = "nnx_state"  # the collection of every variable that is not an nnx.Param
MODEL_METHODS = ("create_model", "model_loss", "model_predict")


class NNXTask:
    """The engine's init, loss and predict for a task whose model is an nnx.Module (module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if missing := [name for name in MODEL_METHODS if not callable(getattr(cls, name, None))]:
            raise TypeError(f"NNX task {cls.__qualname__} has no {', '.join(missing)}: an NNXTask writes "
                            "create_model(self, rngs), model_loss(self, model, batch) and "
                            "model_predict(self, model, batch) (jaxring/engine/nnx_task.py)")

    def init(self, rng) -> dict:
        _, params, rest = nnx.split(self.create_model(nnx.Rngs(rng)), nnx.Param, ...)
        return {"params": nnx.to_pure_dict(params), STATE: _key_data(nnx.to_pure_dict(rest))}

    def loss(self, variables, batch, rng):
        model = self._merged(variables, rng)
        model.train()
        loss = self.model_loss(model, batch)
        _, _, rest = nnx.split(model, nnx.Param, ...)
        shapes = nnx.to_pure_dict(nnx.split(self._abstract_model, nnx.Param, ...)[2])
        stored = nnx.restore_int_paths(variables[STATE])
        keys_kept = jax.tree_util.tree_map(lambda new, old, spec: old if _is_key(spec) else new,
                                           _key_data(nnx.to_pure_dict(rest)), stored, shapes)
        return loss, {STATE: keys_kept}

    def predict(self, variables, batch):
        model = self._merged(variables, None)
        model.eval()
        return self.model_predict(model, batch)

    @functools.cached_property
    def _abstract_model(self) -> nnx.Module:
        """The model's structure and shapes, no arrays: what `variables` are merged into."""
        return nnx.eval_shape(lambda: self.create_model(nnx.Rngs(0)))

    def _merged(self, variables: dict, rng) -> nnx.Module:
        """The model holding `variables`; with `rng` (a step's, per replica) folded into each RNG stream's key."""
        graphdef, params, rest = nnx.split(self._abstract_model, nnx.Param, ...)
        salt = None if rng is None else jax.random.bits(rng, dtype=jnp.uint32)

        def stream_key(data, spec):
            if not _is_key(spec):
                return data
            key = jax.random.wrap_key_data(data)
            return key if salt is None else jax.random.fold_in(key, salt)

        nnx.replace_by_pure_dict(params, variables["params"])
        nnx.replace_by_pure_dict(rest, jax.tree_util.tree_map(stream_key, nnx.restore_int_paths(variables[STATE]),
                                                              nnx.to_pure_dict(rest)))
        return nnx.merge(graphdef, params, rest)


def _is_key(leaf) -> bool:
    return jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _key_data(tree):
    """`tree` with each PRNG key as its key data: what a checkpoint can hold."""
    return jax.tree_util.tree_map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, tree)
