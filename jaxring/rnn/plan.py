"""How a persistent recurrent layer splits its hidden units over thread blocks, and whether it fits.

Each block owns a contiguous run of hidden units, with every gate's column for
those units, so a GRU's gates combine inside the block, for a contiguous run
of the batch's utterances (all of them, or a share where that cuts the state
each block reads from L2). The forward pass holds
the recurrent kernel's columns for its units and multiplies the whole previous
state by them; the backward pass holds the rows for its units and multiplies
the whole recurrent input's gradient by them, both on the tensor cores, the
left operand staged in shared memory a chunk of columns at a time
(docs/PERSISTENT_RNN.md, "Partitioning"). The byte counts here are the
kernels' (csrc/persistent_rnn.h's Tiling, csrc/persistent_rnn.cu's
ForwardSharedBytes and BackwardSharedBytes), held equal by
tests/jaxring/rnn/test_persistent_rnn_source.py.
"""

from __future__ import annotations

import dataclasses

# Float32 accumulators and carried gradients, whatever the compute dtype.
ACCUMULATOR_BYTES = 4
# csrc/persistent_rnn.h's kThreadsPerBlock, kWarpSize, kTile and kColumnTilesPerWarp.
THREADS_PER_BLOCK = 512
WARPS = THREADS_PER_BLOCK // 32
TILE = 16
COLUMN_TILES_PER_WARP = 2
# A staged chunk's exposed L2 round trip (about 1 us, in which an SM could stage about 32 KB at its
# share of L2's bandwidth): an assumption for choosing splits (docs/PERSISTENT_RNN.md), not a measurement.
STAGING_ROUND_TRIP_BYTES = 32 * 1024


def round_to_tile(n: int) -> int:
    return -(-n // TILE) * TILE


def padded_lead(n: int, element_bytes: int) -> int:
    """A tile-padded operand's row stride in shared memory: 16 bytes more, against bank conflicts."""
    return round_to_tile(n) + 16 // element_bytes


@dataclasses.dataclass(frozen=True)
class Tiling:
    """One block's product [batch, depth] x [depth, outputs] in tiles (csrc/persistent_rnn.h's Tiling):
    warps take a row tile, COLUMN_TILES_PER_WARP column tiles and a split of each staged chunk's depth."""

    batch: int
    depth_units: int
    outputs: int
    chunk: int

    @property
    def rows(self) -> int:
        return round_to_tile(self.batch)

    @property
    def columns(self) -> int:
        return round_to_tile(self.outputs)

    @property
    def depth(self) -> int:
        return round_to_tile(self.depth_units)

    @property
    def splits(self) -> int:
        column_groups = -(-(self.columns // TILE) // COLUMN_TILES_PER_WARP)
        by_warps = WARPS // ((self.rows // TILE) * column_groups)
        return max(1, min(by_warps, self.chunk // TILE))

    @property
    def sums_bytes(self) -> int:
        return self.splits * self.rows * self.columns * ACCUMULATOR_BYTES

    def staged_bytes(self, element_bytes: int) -> int:
        return self.rows * padded_lead(self.chunk, element_bytes) * element_bytes


@dataclasses.dataclass(frozen=True)
class DeviceBudget:
    """What one kernel may use: one block per SM, all resident at once for the grid barrier."""

    name: str
    sms: int
    shared_bytes_per_block: int  # opt-in maximum of dynamic shared memory per block


# Per-block shared-memory maxima from the CUDA programming guide's table of compute capabilities.
H100 = DeviceBudget("H100 (sm_90)", sms=132, shared_bytes_per_block=227 * 1024)
H200 = DeviceBudget("H200 (sm_90)", sms=132, shared_bytes_per_block=227 * 1024)
A100 = DeviceBudget("A100 (sm_80)", sms=108, shared_bytes_per_block=163 * 1024)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A layer's split: per direction, `batch_groups` runs of `batch_rows` utterances times `unit_groups`
    runs of units [starts[g], starts[g + 1]), one block for each pair."""

    hidden: int
    gates: int
    batch: int
    directions: int
    weight_bytes: int  # bytes of one compute-dtype weight
    starts: tuple[int, ...]
    batch_rows: int  # utterances per block: the whole batch, or a multiple of TILE
    forward_chunk: int = TILE  # columns of the state staged at once going forward
    backward_chunk: int = TILE  # columns of the recurrent input's gradient staged at once going backward

    @property
    def unit_groups(self) -> int:
        return len(self.starts) - 1

    @property
    def batch_groups(self) -> int:
        return -(-self.batch // self.batch_rows)

    @property
    def blocks_per_direction(self) -> int:
        return self.batch_groups * self.unit_groups

    @property
    def blocks(self) -> int:
        return self.directions * self.blocks_per_direction

    @property
    def max_units(self) -> int:
        return max(b - a for a, b in zip(self.starts, self.starts[1:]))

    def units(self, block: int) -> range:
        """Block `block` (of a direction's blocks_per_direction) owns these units..."""
        group = block % self.unit_groups
        return range(self.starts[group], self.starts[group + 1])

    def rows(self, block: int) -> range:
        """... for these utterances."""
        first = block // self.unit_groups * self.batch_rows
        return range(first, min(self.batch, first + self.batch_rows))

    def columns(self, block: int) -> list[int]:
        """The block's columns of the [H, gates * H] kernel: each gate's columns for its units, gate by gate."""
        return [gate * self.hidden + unit for gate in range(self.gates) for unit in self.units(block)]

    @property
    def forward_tiling(self) -> Tiling:
        """A block's rows of the state [rows, H] times its kernel columns [H, gates x units]."""
        return Tiling(self.batch_rows, self.hidden, self.gates * self.max_units, self.forward_chunk)

    @property
    def backward_tiling(self) -> Tiling:
        """A block's rows of the recurrent input's gradient [rows, gates x H] times its kernel rows, transposed."""
        return Tiling(self.batch_rows, self.gates * self.hidden, self.max_units, self.backward_chunk)

    @property
    def forward_bytes(self) -> int:
        """Shared memory per block going forward: split sums, its kernel columns, the staged state chunk."""
        t, size = self.forward_tiling, self.weight_bytes
        return t.sums_bytes + t.depth * padded_lead(t.columns, size) * size + t.staged_bytes(size)

    @property
    def backward_bytes(self) -> int:
        """Going backward: split sums, its kernel rows, the staged gradient chunk, its carried gradient."""
        t, size = self.backward_tiling, self.weight_bytes
        return (t.sums_bytes + t.columns * padded_lead(t.depth, size) * size + t.staged_bytes(size)
                + self.batch_rows * self.max_units * ACCUMULATOR_BYTES)

    @property
    def staging_cost(self) -> int:
        """What a block's staging costs a frame, forward and backward, in bytes of L2 reads: its rows of
        the state and of the recurrent input's gradient, plus each chunk's exposed L2 round trip."""
        chunks = (-(-round_to_tile(self.hidden) // self.forward_chunk)
                  - (-round_to_tile(self.gates * self.hidden) // self.backward_chunk))
        return (self.batch_rows * (1 + self.gates) * self.hidden * self.weight_bytes
                + chunks * STAGING_ROUND_TRIP_BYTES)


def split_units(hidden: int, blocks: int) -> tuple[int, ...]:
    """Boundaries of `blocks` contiguous runs over `hidden` units, the first hidden % blocks one longer."""
    base, longer = divmod(hidden, blocks)
    starts = [0]
    for block in range(blocks):
        starts.append(starts[-1] + base + (block < longer))
    return tuple(starts)


def plan_layer(hidden: int, gates: int, batch: int, directions: int, weight_bytes: int,
               device: DeviceBudget) -> Plan | str:
    """The split of a layer over `device`, or a sentence saying why it does not fit (for the fallback's log line).

    Every block stages its utterances' whole state (forward) and recurrent-input gradient (backward)
    from L2 each frame; splitting the batch as well as the units cuts that traffic, at the price of
    more weights a block. Of the splits that fit, the one with the least staging_cost."""
    for name, value in dict(hidden=hidden, gates=gates, batch=batch, directions=directions,
                            weight_bytes=weight_bytes).items():
        if value < 1:
            raise ValueError(f"plan_layer: {name} must be at least 1, got {value}")
    per_direction = device.sms // directions
    if per_direction < 1:
        return f"{directions} directions need at least {directions} SMs, {device.name} has {device.sms}"
    fits, refusal = [], None
    for groups in range(1, min(per_direction, -(-batch // TILE)) + 1):
        rows = batch if groups == 1 else round_to_tile(-(-batch // groups))
        if -(-batch // rows) != groups:
            continue  # the same split as fewer groups
        plan = _fit(Plan(hidden, gates, batch, directions, weight_bytes,
                         split_units(hidden, min(hidden, per_direction // groups)), rows), device)
        if isinstance(plan, str):
            refusal = refusal or plan
        else:
            fits.append(plan)
    return min(fits, key=lambda plan: plan.staging_cost) if fits else refusal


def _fit(plan: Plan, device: DeviceBudget) -> Plan | str:
    """`plan` with the widest chunks that fit `device`, or why none do."""
    budget = device.shared_bytes_per_block
    forward_chunk = _widest_chunk(plan.hidden,
                                  lambda c: dataclasses.replace(plan, forward_chunk=c).forward_bytes <= budget)
    backward_chunk = _widest_chunk(plan.gates * plan.hidden,
                                   lambda c: dataclasses.replace(plan, backward_chunk=c).backward_bytes <= budget)
    if forward_chunk is None or backward_chunk is None:
        need = max(plan.forward_bytes, plan.backward_bytes)  # at the narrowest chunks
        return (f"hidden {plan.hidden} x {plan.gates} gates at batch {plan.batch} needs {need} bytes per block over "
                f"{plan.blocks_per_direction} blocks per direction, {device.name} has {budget}")
    return dataclasses.replace(plan, forward_chunk=forward_chunk, backward_chunk=backward_chunk)


def _widest_chunk(depth: int, fits) -> int | None:
    """The widest chunk that `fits`, of the tile-multiple widths that cut `depth` into equal pieces:
    the fewer chunks, the fewer block barriers per frame."""
    tiles = round_to_tile(depth) // TILE
    for pieces in range(1, tiles + 1):
        chunk = -(-tiles // pieces) * TILE
        if fits(chunk):
            return chunk
    return None
