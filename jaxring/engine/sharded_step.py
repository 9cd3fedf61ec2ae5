"""train.shard_optimizer: the step's update split over every device of every process (collectives/sharded_update.py).

The gradients skip the sync's all-reduce: they are reduce-scattered, each device
updates its block of the weights with its block of the optimizer state, and the
weights are all-gathered. The loss and the model state's averaged leaves
(model_state.py) still take the sync's mean. On the devices the TrainState's opt_state holds each device's blocks
(pmap's leading axis); on the host, and in checkpoints, the whole layout of
the replicated step, so a run resumes with or without the setting, on any
number of devices and processes (on_devices, on_host: the latter gathers every
process' blocks, collectively).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxring.collectives.sharded_update import ShardedUpdate
from jaxring.engine.devices import replicate, unreplicate
from jaxring.engine.model_state import mean_of_step
from jaxring.engine.sync import Sync
from jaxring.engine.task import AXIS


def sharded_update(parts, sync: Sync) -> ShardedUpdate:
    """The update of step.StepParts `parts` (shard_optimizer) over the sync's devices and processes."""
    return ShardedUpdate(parts.optimizer, AXIS, clip_norm=parts.clip_norm, decay_mask=parts.decay_mask,
                         bucket_bytes=sync.bucket_bytes,
                         processes=sync.world_size > 1, wire_dtype=sync.wire_dtype,
                         local="ring" if sync.method == "ring" else "lax",
                         skip_nonfinite=parts.compute_dtype == "float16")


def finish(parts, sync: Sync, state, local):
    """step.StepParts.finish for shard_optimizer, from one device's own (gradients, model state, loss).

    Under loss scaling a step whose mean gradients overflowed anywhere (one count over every
    block, so every device decides alike) keeps weights and state and halves the scale."""
    grads, model_state, loss = local
    _, model_state, loss = mean_of_step(lambda tree: (tree[0], *sync.mean(tree[1:])), ((), model_state, loss))
    update = sharded_update(parts, sync).update(grads, state.opt_state, state.params)
    loss_scale = None if state.loss_scale is None else state.loss_scale.after(update.finite)
    state = state.replace(step=state.step + 1, params=update.params, opt_state=update.opt_state,
                          model_state=model_state, loss_scale=loss_scale)
    return state, {"loss": loss, "grad_norm": update.grad_norm}


def on_devices(state, sharded: ShardedUpdate, devices):
    """A host TrainState (whole layout) on this process' `devices`: replicated, its optimizer state
    split into blocks, this process' ones on its devices."""
    placed = replicate(state.replace(opt_state=()), devices)
    mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
    indices = sharded.block_indices(len(devices))
    blocks = sharded.split_state(state.opt_state, state.params, len(devices) * sharded.process_position()[1])
    mine = [blocks[i] for i in indices]
    stacked = jax.tree_util.tree_map(lambda *per_device: jax.device_put(np.stack(per_device), sharding), *mine)
    return placed.replace(opt_state=stacked)


def on_host(state, sharded: ShardedUpdate, all_gather=lambda own: [own]):
    """The host TrainState (whole layout, what a checkpoint holds) of a state on the devices.

    `all_gather(own)`: every process' `own` (a host object), in rank order (HostExchange.all_gather;
    collective: every process calls on_host)."""
    host = unreplicate(state.replace(opt_state=()))
    devices = jax.tree_util.tree_leaves(state.params)[0].shape[0]
    own = [(i, jax.tree_util.tree_map(lambda x: np.asarray(x[d]), state.opt_state))
           for d, i in enumerate(sharded.block_indices(devices))]
    blocks = dict(pair for process in all_gather(own) for pair in process)
    return host.replace(opt_state=sharded.whole_state([blocks[i] for i in range(len(blocks))], host.params))
