"""The start-up data check across processes: missing or different data on one rank ends every process, naming it."""

import socket
from pathlib import Path

from tests.tiny_runs import finish, mpirun


def test_missing_or_different_data_on_one_rank_is_named_on_every_rank(tmp_path):
    worker = Path(__file__).with_name("data_check_worker.py")
    code, output = finish(mpirun(2, [worker, tmp_path], with_mpi4py=True, devices_per_proc=1), 120)
    assert code == 0, output
    host = socket.gethostname()
    for rank in (0, 1):
        assert f"rank {rank} same: {{'train': {{'usable': 96}}}}" in output, output
        assert (f"rank {rank} missing: DataError: the training data could not be read on every process: rank 1 "
                f"({host}): data.manifest_dir /data/mine has no train.jsonl") in output, output
        assert (f"rank {rank} differs: DataError: the processes found different training data (rank 0 ({host}), "
                f"rank 1 ({host})): train.usable (rank 0: 96; rank 1: 95)") in output, output
