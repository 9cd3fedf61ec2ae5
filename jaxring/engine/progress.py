"""What a run prints while it trains: a bar in a terminal, plain timestamped lines anywhere else.

A progress bar redraws itself with carriage returns, which a log file under a
batch system (or `| tee`) keeps as one unreadable line. So the bar is drawn
only when stdout is a terminal and the process was not started by an MPI
launcher (Open MPI gives its ranks a pseudo-terminal even when mpirun's
output goes to a file); otherwise each logged row (every `train.log_every`
steps) is one timestamped line. Status lines (compiling,
evaluating, checkpointing) are timestamped lines in both modes. Only the lead
process prints.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import TextIO

from tqdm import tqdm


TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"  # every status line, and the log lines scripts/train.py shows


# Set in every process an MPI launcher starts: Open MPI, PMIx (Open MPI 5, srun --mpi=pmix), MPICH/Hydra.
MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def launched_by_mpi() -> bool:
    return any(name in os.environ for name in MPI_LAUNCHER_VARIABLES)


def counted(n: int, noun: str) -> str:
    """`n` and the noun in proper number: "1 process", "2 processes", "1 host", "8 devices"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def timestamp() -> str:
    return datetime.datetime.now().astimezone().strftime(TIMESTAMP_FORMAT)


class Progress:
    """The console of one process's run; silent unless `enabled`."""

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = enabled and self.stream.isatty() and not launched_by_mpi()
        self.total = 0
        self._bar = None

    def start(self, total: int, initial: int) -> None:
        """Counts steps `initial`..`total`: a bar in a terminal, nothing otherwise until a row is logged."""
        self.total = total
        if self.interactive:
            self._bar = tqdm(total=total, initial=initial, file=self.stream, dynamic_ncols=True)

    def status(self, message: str) -> None:
        """A timestamped line, printed above the bar when there is one."""
        if not self.enabled:
            return
        line = f"{timestamp()} {message}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def logged(self, step: int, fields: dict[str, str]) -> None:
        """The values of a logged row: the bar's postfix in a terminal, a line of their own elsewhere."""
        if self._bar is not None:
            self._bar.set_postfix(fields, refresh=False)
        elif fields:
            self.status(f"step {step}/{self.total} " + " ".join(f"{name} {value}" for name, value in fields.items()))

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(self.total - self._bar.n)
            self._bar.close()
            self._bar = None
