"""Parameter replicas across processes: make them equal (broadcast), check they still are.

Synchronous SGD keeps one copy of the parameters per device. They start equal
when every process takes rank 0's initial values (`broadcast`), and stay
bitwise equal as long as every device applies the same all-reduced update.
`check_replicas` verifies that, cheaply enough to run every few hundred steps:
each device digests its own copies, and only the digests cross processes.
"""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.collectives import agreement, topology


class ReplicasDivergedError(RuntimeError):
    """Copies of the same parameters differ between devices or processes."""


def broadcast(tree, root: int = 0, *, timeout: float | None = None):
    """`root`'s values of `tree` on every process, e.g. initial parameters and optimizer state.

    Collective: every process calls it with a tree of the same structure,
    shapes and dtypes (its own values are overwritten). Leaves are numpy or
    jax arrays of any sharding; jax leaves keep their sharding, other leaves
    come back as numpy arrays. The values travel through host memory: this is
    for start-up, not for every step.
    """
    world = topology.init()
    if not 0 <= root < world.size:
        raise ValueError(f"root must be a rank in [0, {world.size}), got {root}")
    leaves, treedef = jax.tree.flatten(tree)
    agreement.agree(world.comm, "broadcast", {**_describe(tree), "root": str(root)}, timeout)
    received = []
    for leaf in leaves:
        if world.rank == root:
            values = np.asarray(leaf, order="C")
        else:
            values = np.empty(np.shape(leaf), _dtype(leaf))
        world.comm.Bcast(values.reshape(-1).view(np.uint8), root)
        if not isinstance(leaf, jax.Array):
            received.append(values)
        elif world.rank == root:
            received.append(leaf)
        else:
            received.append(jax.device_put(values, leaf.sharding))
    return jax.tree.unflatten(treedef, received)


def replicas_consistent(tree, *, timeout: float | None = None) -> bool:
    """Whether every copy of `tree`, on every device of every process, holds the same bits.

    Collective. `tree` holds replicated values (e.g. parameters as pmap keeps
    them: one row per local device); a partitioned array would count as divergent.
    """
    return not _divergences(tree, timeout)


def check_replicas(tree, *, timeout: float | None = None) -> None:
    """Raises ReplicasDivergedError, on every process, naming the copies that differ.

    Collective; see `replicas_consistent`.
    """
    divergences = _divergences(tree, timeout)
    if divergences:
        raise ReplicasDivergedError(
            "parameter replicas differ, which synchronous SGD never does by itself "
            "(a process missed an update, or wrote its parameters): " + "; ".join(divergences)
        )


def _divergences(tree, timeout):
    """One line per leaf whose copies differ, naming the minority copies."""
    world = topology.init()
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    kinds = {path: f"{described} {'jax' if isinstance(leaf, jax.Array) else 'numpy'}"
             for (path, described), (_, leaf) in zip(_describe(tree).items(), leaves_with_paths)}
    agreement.agree(world.comm, "check_replicas", kinds, timeout)
    copies = {}  # leaf index -> digest -> labels of the copies holding it
    for rank, local in enumerate(world.comm.allgather(_local_digests([l for _, l in leaves_with_paths]))):
        for index, where, digest in local:
            copies.setdefault(index, {}).setdefault(digest, []).append(f"rank {rank} {where}")
    lines = []
    for index, by_digest in sorted(copies.items()):
        if len(by_digest) == 1:
            continue
        groups = sorted(by_digest.values(), key=len, reverse=True)
        others = ", ".join(label for group in groups[1:] for label in group)
        lines.append(
            f"{jax.tree_util.keystr(leaves_with_paths[index][0]) or 'the tree'}: {others} "
            f"differ from the {len(groups[0])} copies on {', '.join(groups[0])}"
        )
    return lines


def _local_digests(leaves):
    """(leaf index, where, digest) for every copy of every leaf held by this process.

    A jax leaf is digested on each device that holds a copy, so only digests
    leave the device; a numpy leaf is hashed on the host.
    """
    by_device = {}
    digests = []
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                by_device.setdefault(shard.device, []).append((index, shard.data))
        else:
            data = np.asarray(leaf, order="C")
            digests.append((index, "host", hashlib.blake2b(data.reshape(-1).view(np.uint8)).hexdigest()))
    for device, items in by_device.items():
        sums = np.asarray(_checksums([data for _, data in items]))
        digests += [(index, f"device {device.id}", s.tobytes().hex()) for (index, _), s in zip(items, sums)]
    return digests


@jax.jit
def _checksums(arrays):
    """Two position-weighted sums of each array's 32-bit words, modulo 2**32.

    The weights are odd, so changing any one element changes the first sum.
    """
    rows = []
    for array in arrays:
        words = _words(array)
        position = jnp.arange(words.size, dtype=jnp.uint32)
        rows.append(
            jnp.stack(
                [
                    jnp.sum(words * (2 * position + 1), dtype=jnp.uint32),
                    jnp.sum((words ^ (words >> 16)) * (position * jnp.uint32(0x9E3779B1) | 1), dtype=jnp.uint32),
                ]
            )
        )
    return jnp.stack(rows)


def _words(array):
    flat = array.reshape(-1)
    if flat.dtype == jnp.bool_:
        flat = flat.astype(jnp.uint8)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[flat.dtype.itemsize]
    return jax.lax.bitcast_convert_type(flat, unsigned).reshape(-1).astype(jnp.uint32)


def _describe(tree) -> dict[str, str]:
    """Each leaf's path -> its dtype and shape, e.g. "['dense']['kernel']" -> "float32[3, 4]"."""
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path) or "the tree": f"{_dtype(leaf).name}{list(np.shape(leaf))}"
            for path, leaf in leaves_with_paths}


def _dtype(leaf):
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
