"""jaxring.ShardedUpdate: an optimizer step split over the devices between the ring's two halves (ZeRO-1/2).

A ring all-reduce is a reduce-scatter and an all-gather. Between the two each device
holds one block of the summed gradients: here it updates only that block of the weights,
with only that block of the optimizer state, and the all-gather carries the updated
weights. The step moves the all-reduce's bytes, and each of the N devices (L of the axis
in each of P processes) keeps 1/N of the optimizer state and does 1/N of the update's arithmetic.

The leaves are packed as fusion.py packs them (same dtype, buckets of at most
`bucket_bytes`), each bucket padded to a multiple of N; a device's blocks are one flat
slice of each bucket. With processes=, the local reduce-scatter leaves local device l the
slice of P blocks that the all-reduce's MPI leg would carry; the leg's reduce-scatter phase
alone (mpi.phase_over_processes) leaves process p block l * P + p of it, and the leg's
all-gather phase carries the updated blocks back before the local all-gather: the
all-reduce's two halves, split at the same point.

The optimizer must be elementwise (optax's sgd, momentum, adam, adamw, schedules that
depend on the step count alone): it sees flat blocks, not the weights' shapes. Clipping
by the global norm is `clip_norm` here, not an optax transformation, because the norm is
a sum over every block: one scalar all-reduce, with the count of non-finite values.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxring.collectives import accumulation, across_processes, fusion
from jaxring.collectives.all_gather import all_gather
from jaxring.collectives.allreduce import allreduce
from jaxring.collectives.reduce_scatter import reduce_scatter


class Blocks(NamedTuple):
    """Where a tree's leaves lie in the buckets, and each device's share of them."""

    layout: fusion.Layout
    sizes: list  # elements of each bucket, unpadded
    block: list  # elements of each device's block of each bucket
    devices: int


def blocks_of(tree, devices: int, bucket_bytes: int) -> Blocks:
    """The block layout of `tree` (arrays or ShapeDtypeStructs) over `devices` devices."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    buckets = fusion.plan_buckets(leaves, bucket_bytes)
    sizes = [sum(math.prod(leaves[i].shape) for i in bucket) for bucket in buckets]
    layout = fusion.Layout(treedef, [(leaf.shape, leaf.dtype) for leaf in leaves], buckets)
    return Blocks(layout, sizes, [-(-size // devices) for size in sizes], devices)


def _padded_flats(tree, blocks: Blocks, xp):
    """Each bucket of `tree` as one flat array padded to devices x block elements (`xp`: jnp or np)."""
    leaves = jax.tree_util.tree_leaves(tree)
    flats = []
    for bucket, size, block in zip(blocks.layout.buckets, blocks.sizes, blocks.block):
        flat = xp.concatenate([xp.reshape(leaves[i], -1) for i in bucket])
        flats.append(xp.pad(flat, (0, blocks.devices * block - size)))
    return flats


def _whole(flats, blocks: Blocks):
    """The tree whose padded buckets are `flats`."""
    return fusion.unpack([flat[:size] for flat, size in zip(flats, blocks.sizes)], blocks.layout)


class Update(NamedTuple):
    """What ShardedUpdate.update returns: the state after the step, and the step's facts."""

    params: Any  # whole on every device, the same bits everywhere
    opt_state: Any  # this device's blocks
    grad_norm: jax.Array  # of the mean gradients over every block, before clipping
    finite: jax.Array  # bool: every mean gradient is finite (the same on every device)


class ShardedUpdate:
    """`optimizer` applied to each device's block of the weights, between a reduce-scatter and an all-gather.

    Inside pmap or shard_map over `axis_name` (this process' devices; with `processes` as
    allreduce's, over the MPI processes too, each process' devices summing with the same
    device of every other; under jax.distributed, a shard_map axis spanning the processes, without `processes`):

        sharded = jaxring.ShardedUpdate(optax.adamw(1e-3), "d", clip_norm=1.0)
        opt_state = jax.pmap(sharded.init, axis_name="d")(replicated_params)
        params, opt_state, grad_norm, finite = sharded.update(local_grads, opt_state, params)

    `update` takes each device's own gradients and averages them itself; its weights
    are those of `optimizer` and optax.clip_by_global_norm(clip_norm) applied to the
    averaged gradients on every device (the summed gradients are the all-reduce's bits:
    the reduce-scatter adds in the same order). With `skip_nonfinite`, a step whose mean
    gradients hold an infinity or NaN leaves weights and state as they were.
    `local`: "ring" (jaxring's reduce-scatter and all-gather) or "lax" (lax's psum_scatter
    and all_gather); `wire_dtype` as allreduce's, for the gradients across processes (the
    weights cross whole). `decay_mask`: optax.adamw's mask (a tree of bools shaped as the
    weights, or a function of them), for an `optimizer` built without one, which would see
    flat blocks: the optimizer sees the weights outside it as zeros, so it must use the
    weights for their decay alone (optax's sgd, adam and adamw do).
    """

    def __init__(self, optimizer: optax.GradientTransformation, axis_name, *, clip_norm: float | None = None,
                 bucket_bytes: int | None = None, processes=False, wire_dtype: str | None = None,
                 local: str = "ring", skip_nonfinite: bool = False, decay_mask=None):
        if local not in fusion.LOCAL:
            raise ValueError(f"ShardedUpdate(local={local!r}): the collectives among this process' devices are "
                             f"one of {fusion.LOCAL}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"ShardedUpdate(clip_norm={clip_norm!r}): a positive norm, or None for no clipping")
        self.optimizer = optimizer
        self.axis_name = axis_name
        self.clip_norm = clip_norm
        self.bucket_bytes = bucket_bytes
        self.processes = processes
        self.wire_dtype = wire_dtype
        self.local = local
        self.skip_nonfinite = skip_nonfinite
        self.decay_mask = decay_mask

    # -- inside pmap / shard_map

    def _blocks(self, tree) -> Blocks:
        axis = jax.lax.axis_size(self.axis_name)
        if self.process_position()[1] > 1 and across_processes.spans_processes(axis):
            raise ValueError(
                f"ShardedUpdate({self.axis_name!r}, processes=...): the axis has {axis} devices, more than this "
                f"process' {jax.local_device_count()}, so it spans jax.distributed processes and its reduce-scatter "
                "and all-gather already cross them. Drop processes=, or map the axis over jax.local_devices().")
        devices = axis * self.process_position()[1]
        return blocks_of(tree, devices, self.bucket_bytes or fusion.default_bucket_bytes())

    def process_position(self) -> tuple[int, int]:
        """(this process' rank, the number of processes) among those `processes` names; (0, 1) without."""
        communicator = across_processes.communicator(self.processes)
        return (0, 1) if communicator is None else (communicator.handshake.Get_rank(), communicator.size)

    def block_indices(self, local_devices: int) -> list:
        """Which of split_state's blocks each of this process' `local_devices` devices holds, in axis order."""
        rank, count = self.process_position()
        return [local * count + rank for local in range(local_devices)]

    def own_blocks(self, tree, blocks: Blocks | None = None) -> list:
        """This device's block of each bucket of `tree` (shaped as the weights): what the optimizer sees."""
        blocks = blocks or self._blocks(tree)
        rank, count = self.process_position()
        index = jax.lax.axis_index(self.axis_name) * count + rank
        return [jax.lax.dynamic_slice_in_dim(flat, index * block, block)
                for flat, block in zip(_padded_flats(tree, blocks, jnp), blocks.block)]

    def init(self, params):
        """This device's optimizer state: `optimizer.init` of its blocks of `params`."""
        return self.optimizer.init(self.own_blocks(params))

    def update(self, grads, opt_state, params) -> Update:
        """One step from this device's own `grads` (averaged here over every device and process)."""
        blocks = self._blocks(params)
        mine = [self._summed_block(flat) for flat in _padded_flats(grads, blocks, jnp)]
        mine = [accumulation.mean(g, blocks.devices) for g in mine]
        # One scalar pair over every device of every process: the sum of squares (a global norm) and
        # the count of non-finite values (not inferred from the norm: large finite values square to inf).
        squares = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in mine)
        bad = sum(jnp.sum(~jnp.isfinite(g)).astype(jnp.float32) for g in mine)
        totals = allreduce(jnp.stack([squares, bad]), self.axis_name, processes=self.processes)
        grad_norm, finite = jnp.sqrt(totals[0]), totals[1] == 0
        if self.clip_norm is not None:
            # optax.clip_by_global_norm's formula, with the norm over every block.
            mine = [jnp.where(grad_norm < self.clip_norm, g, (g / grad_norm.astype(g.dtype)) * self.clip_norm)
                    .astype(g.dtype) for g in mine]
        own_params = self.own_blocks(params, blocks)
        updates, new_state = self.optimizer.update(mine, opt_state, self._decaying(params, own_params, blocks))
        new_params = optax.apply_updates(own_params, updates)
        if self.skip_nonfinite:
            keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            new_params, new_state = keep(new_params, own_params), keep(new_state, opt_state)
        gathered = [self._gathered(block) for block in new_params]
        return Update(_whole(gathered, blocks), new_state, grad_norm, finite)

    def _decaying(self, params, own_params, blocks: Blocks) -> list:
        """`own_params` with the weights outside decay_mask as zeros (times 0 or 1: exact)."""
        if self.decay_mask is None:
            return own_params
        mask = self.decay_mask(params) if callable(self.decay_mask) else self.decay_mask
        ones = jax.tree_util.tree_map(lambda m, p: jnp.full(jnp.shape(p), m, jnp.result_type(p)), mask, params)
        return [p * m for p, m in zip(own_params, self.own_blocks(ones, blocks))]

    def _summed_block(self, flat):
        """This device's block of the sum of `flat` over every device (and process)."""
        if self.local == "ring":
            block = reduce_scatter(flat, self.axis_name, tiled=True)
        else:
            block = jax.lax.psum_scatter(flat, self.axis_name, tiled=True)
        if self.process_position()[1] > 1:
            # Each device meets the same device of every process, as in the all-reduce's leg.
            block = across_processes.phase_over_processes(block, "reduce_scatter", self.processes, self.wire_dtype)
        return block

    def _gathered(self, block):
        """Every device's `block` of every process, in split_state's order (the weights cross whole,
        never in wire_dtype)."""
        rank, count = self.process_position()
        if count > 1:
            placed = jnp.pad(block, (rank * block.size, (count - 1 - rank) * block.size))
            block = across_processes.phase_over_processes(placed, "all_gather", self.processes)
        # Invariant: under shard_map(check_vma) the weights leave with out_specs P(), as they came in.
        if self.local == "ring":
            return all_gather(block, self.axis_name, tiled=True, to="invarying")
        return jax.lax.all_gather(block, self.axis_name, tiled=True, to="invarying")

    # -- on the host: the state between the two layouts (checkpoints hold the whole one)

    def split_state(self, whole_state, params, devices: int) -> list:
        """`devices` states in block layout, one per block, from `optimizer.init(params)`'s layout (numpy).

        With processes, `devices` counts every device of every process; block_indices names this process' blocks."""
        blocks = blocks_of(params, devices, self.bucket_bytes or fusion.default_bucket_bytes())
        params_def = jax.tree_util.tree_structure(params)

        def split(subtree, device):
            if not _shaped_like(subtree, params, params_def):
                return np.asarray(subtree)  # a count, a scale: the same on every device
            flats = _padded_flats(jax.tree_util.tree_map(np.asarray, subtree), blocks, np)
            return [flat[device * block:(device + 1) * block] for flat, block in zip(flats, blocks.block)]

        return [jax.tree_util.tree_map(lambda s: split(s, d), whole_state,
                                       is_leaf=lambda s: _shaped_like(s, params, params_def))
                for d in range(devices)]

    def whole_state(self, device_states: list, params):
        """The state in `optimizer.init(params)`'s layout from every block's state, in split_state's order (numpy)."""
        blocks = blocks_of(params, len(device_states), self.bucket_bytes or fusion.default_bucket_bytes())
        template = self.optimizer.init(jax.tree_util.tree_map(
            lambda leaf: np.zeros(np.shape(leaf), np.asarray(leaf).dtype), params))
        params_def = jax.tree_util.tree_structure(params)
        # Leaves in the whole layout's order; a params-shaped subtree there is a list of blocks here.
        whole_leaves, whole_def = jax.tree_util.tree_flatten(
            template, is_leaf=lambda s: _shaped_like(s, params, params_def))
        per_device = [whole_def.flatten_up_to(state) for state in device_states]
        joined = []
        for i, leaf in enumerate(whole_leaves):
            if not _shaped_like(leaf, params, params_def):
                joined.append(np.asarray(per_device[0][i]))
                continue
            flats = [np.concatenate([np.asarray(state[i][b]) for state in per_device])
                     for b in range(len(blocks.block))]
            joined.append(jax.tree_util.tree_map(np.asarray, _whole(flats, blocks)))
        return whole_def.unflatten(joined)


def _shaped_like(subtree, params, params_def) -> bool:
    """Whether `subtree` mirrors `params` (a moment, a trace), not a scalar of the state."""
    if jax.tree_util.tree_structure(subtree) != params_def:
        return False
    return all(np.shape(a) == np.shape(b) for a, b in zip(jax.tree_util.tree_leaves(subtree),
                                                          jax.tree_util.tree_leaves(params)))
