"""The host-side exchanges between a run's processes: what process 0 read, and what every process must share.

Each is collective under MPI (every process calls it, within agreement's
timeout, jaxring/collectives/agreement.py) and the local call alone with one
process. None is on the step's path: they run at start-up, at checkpoints and
at the end.
"""

from __future__ import annotations

import json
import socket

from jaxring.collectives import agreement
from jaxring.collectives.replicas import broadcast, check_replicas
from jaxring.engine import config as config_lib
from jaxring.engine.task import DataError, Task


class HostExchange:
    """This process's side of the exchanges; `comm` is the run's MPI communicator, None with one process."""

    def __init__(self, comm, rank: int):
        self.comm = comm
        self.rank = rank

    def from_lead(self, what: str, read):
        """`read()` as process 0 sees the run directory, on every process; an error there is raised on every one."""
        value = error = None
        if self.rank == 0:
            try:
                value = read()
            except Exception as e:  # raised below on every process, so that none waits for the others
                error = e
        if self.comm is not None:
            agreement.agree(self.comm, f"reading {what}", what)  # every process arrives, within the timeout
            value, error = self.comm.bcast((value, error), root=0)
        if error is not None:
            raise error
        return value

    def broadcast(self, tree):
        """Process 0's values of `tree` (host arrays) on every process."""
        return tree if self.comm is None else broadcast(tree, root=0)

    def all_gather(self, own) -> list:
        """Every process' `own` (a host object), in rank order."""
        return [own] if self.comm is None else self.comm.allgather(own)

    def check_replicas(self, params) -> None:
        """Raises on every process if the processes' copies of `params` differ."""
        if self.comm is not None:
            check_replicas(params)

    def check_before_training(self, config: config_lib.Config, task: Task) -> dict | None:
        """Every process runs the same config; the task's data check (its report, or None)."""
        if self.comm is not None:
            settings = {key: json.dumps(value) for key, value in _dotted(config.to_dict()).items()}
            try:
                agreement.agree(self.comm, "the training config", settings)
            except ValueError as e:  # processes given different configs: a config error, on every process
                raise config_lib.ConfigError(str(e)) from None
        check_data = getattr(task, "check_data", None)  # optional in the Task contract
        if self.comm is None:
            return check_data() if check_data else None
        return self._check_same_data(check_data)

    def _check_same_data(self, check_data) -> dict | None:
        """The task's data check on every process, which must all find the same data (each reads its own: a
        copy per host at the same path, or a shared filesystem); else a DataError on every process naming
        the ranks and hosts whose data is missing or differs (docs/MULTI_NODE.md, "The data")."""
        report = failure = None
        try:
            report = check_data() if check_data else None
        except (DataError, OSError) as e:  # raised below on every process, naming this one
            failure = str(e)
        agreement.agree(self.comm, "the data check", "checked")  # every process arrives, within the timeout
        found = self.comm.allgather((socket.gethostname(), failure, _dotted(report or {})))
        where = [f"rank {rank} ({host})" for rank, (host, _, _) in enumerate(found)]
        failed = [f"{where[rank]}: {failure}" for rank, (_, failure, _) in enumerate(found) if failure]
        if failed:
            raise DataError("the training data could not be read on every process: " + "; ".join(failed))
        reports = [{key: json.dumps(value) for key, value in dotted.items()} for _, _, dotted in found]
        if any(other != reports[0] for other in reports):
            raise DataError(
                f"the processes found different training data ({', '.join(where)}): "
                f"{agreement.differences(reports)}. Every process reads the data at the config's paths: give "
                "every host the same copy there, or put it on a filesystem they share (docs/MULTI_NODE.md)")
        return report


def _dotted(tree: dict, prefix: str = "") -> dict:
    """{"train": {"seed": 0}} -> {"train.seed": 0}: the config's keys as --set names them."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
