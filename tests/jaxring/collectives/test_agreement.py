"""agreement.py's roll call under mpirun: a timed-out roll call leaves nothing that a later one, or MPI's shutdown, trips on."""

import pathlib

from jaxring.collectives import agreement
from tests.tiny_runs import finish, mpirun

WORKER = pathlib.Path(__file__).with_name("mpi_workers") / "roll_call.py"


def test_a_timed_out_roll_call_neither_steals_the_next_answer_nor_holds_up_shutdown():
    code, output = finish(mpirun(2, [WORKER], with_mpi4py=True, devices_per_proc=1), 120)
    assert code is not None, f"mpirun did not finish within 120 s (MPI shutdown waiting?):\n{output}"
    assert code == 0, output
    assert "rank 0 first roll call missing [1]\n" in output, output
    for rank in (0, 1):  # rank 1 answered the second call: its answer went to that call's receive
        assert f"rank {rank} second roll call missing []\n" in output, output


def test_trees_that_differ_across_ranks_are_reported_by_the_leaves_that_differ():
    worker = pathlib.Path(__file__).with_name("mpi_workers") / "mismatched_trees.py"
    code, output = finish(mpirun(2, [worker], with_mpi4py=True, devices_per_proc=1), 120)
    assert code == 0, output
    for rank in (0, 1):
        for call, extra in (("broadcast", ""), ("check_replicas", " numpy")):
            expected = (f"rank {rank} {call}: {call} was called with different arguments on different processes: "
                        f"['layer_7']['bias'] (rank 0: float32[4]{extra}; rank 1: float32[5]{extra}). Every process")
            assert expected in output, output


def test_only_the_differing_entries_are_listed_and_at_most_a_few():
    same = {f"leaf{i}": "float32[3]" for i in range(50)}
    ranks = [dict(same), dict(same, leaf3="float32[4]"), dict(same, leaf3="float32[4]")]
    assert agreement.differences(ranks) == "leaf3 (rank 0: float32[3]; ranks 1, 2: float32[4])"
    extra = dict(same, extra="int32[]")
    assert agreement.differences([same, extra]) == "extra (rank 0: (absent); rank 1: int32[])"
    many = [same, {key: "float16[3]" for key in same}]
    listed = agreement.differences(many)
    assert listed.count("float16[3]") == agreement.MAX_DIFFERENCES
    assert listed.endswith(f"; and {50 - agreement.MAX_DIFFERENCES} more entries differ")
    assert agreement.differences(["seed=0", "seed=1", "seed=0"]) == "ranks 0, 2: seed=0; rank 1: seed=1"
