"""agreement.py's roll call under mpirun: a timed-out roll call leaves nothing that a later one, or MPI's shutdown, trips on."""

import pathlib

from tests.tiny_runs import finish, mpirun

WORKER = pathlib.Path(__file__).with_name("mpi_workers") / "roll_call.py"


def test_a_timed_out_roll_call_neither_steals_the_next_answer_nor_holds_up_shutdown():
    code, output = finish(mpirun(2, [WORKER], with_mpi4py=True, devices_per_proc=1), 120)
    assert code is not None, f"mpirun did not finish within 120 s (MPI shutdown waiting?):\n{output}"
    assert code == 0, output
    assert "rank 0 first roll call missing [1]\n" in output, output
    for rank in (0, 1):  # rank 1 answered the second call: its answer went to that call's receive
        assert f"rank {rank} second roll call missing []\n" in output, output
