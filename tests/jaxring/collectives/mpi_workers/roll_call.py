"""Run by test_agreement.py under mpirun, 2 processes: a roll call that times out, then one every process joins.

Rank 1 stays away from the first roll call (it waits for rank 0 to say the
roll call is over), so rank 0 finds it missing. Then both call the roll
again: rank 1's answer must reach rank 0's new roll call, not the receive
left from the timed-out one, and every process must then shut MPI down.
"""

import numpy as np
from mpi4py import MPI

from jaxring.collectives import agreement

comm = MPI.COMM_WORLD
assert comm.Get_size() == 2, "run with 2 processes"
FIRST_DONE_TAG = 1
if comm.Get_rank() == 0:
    print(f"rank 0 first roll call missing {agreement.missing_ranks(comm, 0.2)}", flush=True)
    comm.Send(np.zeros(1, np.int32), dest=1, tag=FIRST_DONE_TAG)
else:
    comm.Recv(np.empty(1, np.int32), source=0, tag=FIRST_DONE_TAG)
# A long grace: it ends as soon as every answer is in; a missing answer costs the whole 30 s.
print(f"rank {comm.Get_rank()} second roll call missing {agreement.missing_ranks(comm, 30.0)}", flush=True)
