"""Run by test_mpi.py under mpirun: jaxring under jax.distributed (JAX's own multi-process runtime).

A jaxring op over a mesh axis that spans processes is refused when it is
compiled, at once, saying what to do (never a wait for the timeout); over an
axis within each process of the global mesh it works, and so does
processes=True over each process' own devices, as under mpirun alone. JAX's process index must be the MPI rank.
"""

import socket
import time

from mpi4py import MPI

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
if rank == 0:
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
else:
    port = None
port = comm.bcast(port)
jax.distributed.initialize(f"localhost:{port}", num_processes=size, process_id=rank)
assert jax.process_index() == rank and jax.process_count() == size, (jax.process_index(), rank)

import jaxring  # noqa: E402  (after jax.distributed, as a user would)

L = jax.local_device_count()
mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.full((L, 3), rank + 1, np.float32))
spanning = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
start = time.monotonic()
try:
    spanning(x)
except ValueError as error:
    message, seconds = str(error), time.monotonic() - start
else:
    raise AssertionError("jaxring.allreduce over a mesh spanning processes was not refused")
assert f"spans the processes {list(range(size))}" in message and "processes=True" in message, message
assert "jax.lax.psum" in message, message
# Refused while compiling, not after a wait: far below any timeout (timings are not tested here).
assert seconds < 60, seconds
print(f"rank {rank}: refused in {seconds:.3f} s", flush=True)

# An axis within each process of a global mesh is a ring of one process: it works.
grid = Mesh(np.array(jax.devices()).reshape(size, L), ("p", "l"))
mine = np.random.default_rng([8, rank]).standard_normal((1, L, 4)).astype(np.float32)
blocks = jax.make_array_from_process_local_data(NamedSharding(grid, P("p", "l")), mine)
local_sum = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "l"), mesh=grid, in_specs=P("p", "l"), out_specs=P("p")))
got = np.asarray(local_sum(blocks).addressable_shards[0].data)
np.testing.assert_allclose(got[0, 0], mine[0].astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)

rows = np.random.default_rng([7, rank]).standard_normal((L, 5)).astype(np.float32)
every = [np.random.default_rng([7, r]).standard_normal((L, 5)).astype(np.float64) for r in range(size)]
out = jax.pmap(lambda v: jaxring.allreduce(v, "i", processes=True), "i", devices=jax.local_devices())(rows)
np.testing.assert_allclose(np.asarray(out), np.broadcast_to(sum(e.sum(0) for e in every), out.shape), rtol=1e-5, atol=1e-5)
print(f"PASS rank {rank} distributed", flush=True)
