"""How a persistent recurrent layer splits its hidden units over thread blocks, and whether it fits.

Each block owns a contiguous run of hidden units, with every gate's column for
those units, so a GRU's gates combine inside the block. The forward pass holds
the recurrent kernel's columns for its units; the backward pass holds the rows
for its units and accumulates the kernel gradient's columns in float32
(docs/PERSISTENT_RNN.md, "Partitioning").
"""

from __future__ import annotations

import dataclasses

# Float32 accumulators, and the float32 kernel-gradient slice, whatever the compute dtype.
ACCUMULATOR_BYTES = 4


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
    """A layer's split: `blocks_per_direction` blocks per direction, units [starts[j], starts[j + 1]) each."""

    hidden: int
    gates: int
    batch: int
    directions: int
    weight_bytes: int  # bytes of one compute-dtype weight
    starts: tuple[int, ...]

    @property
    def blocks_per_direction(self) -> int:
        return len(self.starts) - 1

    @property
    def blocks(self) -> int:
        return self.directions * self.blocks_per_direction

    @property
    def max_units(self) -> int:
        return max(b - a for a, b in zip(self.starts, self.starts[1:]))

    def units(self, block: int) -> range:
        return range(self.starts[block], self.starts[block + 1])

    def columns(self, block: int) -> list[int]:
        """The block's columns of the [H, gates * H] kernel: each gate's columns for its units, gate by gate."""
        return [gate * self.hidden + unit for gate in range(self.gates) for unit in self.units(block)]

    @property
    def forward_bytes(self) -> int:
        """On chip per block going forward: its kernel columns and its batch's gate accumulators."""
        columns = self.gates * self.max_units
        return self.hidden * columns * self.weight_bytes + self.batch * columns * ACCUMULATOR_BYTES

    @property
    def backward_bytes(self) -> int:
        """Going backward: its kernel rows, its float32 kernel-gradient columns, its units' carried gradient."""
        columns = self.gates * self.max_units
        return (self.hidden * columns * (self.weight_bytes + ACCUMULATOR_BYTES)
                + self.batch * self.max_units * ACCUMULATOR_BYTES)


def split_units(hidden: int, blocks: int) -> tuple[int, ...]:
    """Boundaries of `blocks` contiguous runs over `hidden` units, the first hidden % blocks one longer."""
    base, longer = divmod(hidden, blocks)
    starts = [0]
    for block in range(blocks):
        starts.append(starts[-1] + base + (block < longer))
    return tuple(starts)


def plan_layer(hidden: int, gates: int, batch: int, directions: int, weight_bytes: int,
               device: DeviceBudget) -> Plan | str:
    """The split of a layer over `device`, or a sentence saying why it does not fit (for the fallback's log line)."""
    for name, value in dict(hidden=hidden, gates=gates, batch=batch, directions=directions,
                            weight_bytes=weight_bytes).items():
        if value < 1:
            raise ValueError(f"plan_layer: {name} must be at least 1, got {value}")
    blocks = min(hidden, device.sms // directions)
    if blocks < 1:
        return f"{directions} directions need at least {directions} SMs, {device.name} has {device.sms}"
    plan = Plan(hidden, gates, batch, directions, weight_bytes, split_units(hidden, blocks))
    need = max(plan.forward_bytes, plan.backward_bytes)
    if need > device.shared_bytes_per_block:
        return (f"hidden {hidden} x {gates} gates at batch {batch} needs {need} bytes per block over "
                f"{blocks} blocks per direction, {device.name} has {device.shared_bytes_per_block}")
    return plan
