"""The console of a run: a bar only in a terminal, timestamped lines elsewhere, silence off the lead process."""

import io
import re

import pytest

from jaxring.engine.progress import MPI_LAUNCHER_VARIABLES, Progress, counted

TIMESTAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def drive(progress):
    progress.status("compiling")
    progress.start(total=4, initial=1)
    for step in (2, 3, 4):
        if step % 2 == 0:
            progress.logged(step, {"loss": f"{1 / step:.3f}"})
        progress.advance()
    progress.status("evaluating dev")
    progress.close()


def test_off_a_terminal_each_logged_row_is_one_timestamped_line():
    stream = io.StringIO()
    drive(Progress(enabled=True, stream=stream))
    assert stream.getvalue().splitlines() == [
        line for line in stream.getvalue().splitlines() if re.fullmatch(TIMESTAMP + " .+", line)
    ]
    assert [line[20:] for line in stream.getvalue().splitlines()] == [
        "compiling", "step 2/4 loss 0.500", "step 4/4 loss 0.250", "evaluating dev"
    ]


def test_in_a_terminal_a_bar_with_status_lines_above_it(monkeypatch):
    for name in MPI_LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    stream = Terminal()
    drive(Progress(enabled=True, stream=stream))
    text = stream.getvalue()
    assert "\r" in text and "4/4" in text and "loss=0.250" in text
    assert re.search(TIMESTAMP + " compiling\n", text) and re.search(TIMESTAMP + " evaluating dev\n", text)
    assert "step 2/4" not in text  # rows go to the bar, not to lines of their own


def test_a_process_other_than_the_lead_prints_nothing():
    stream = Terminal()
    drive(Progress(enabled=False, stream=stream))
    assert stream.getvalue() == ""


@pytest.mark.parametrize("variable", MPI_LAUNCHER_VARIABLES)
def test_under_an_mpi_launcher_a_terminal_still_gets_lines(monkeypatch, variable):
    """Open MPI gives its ranks a pseudo-terminal even when mpirun's output goes to a file."""
    monkeypatch.setenv(variable, "0")
    stream = Terminal()
    drive(Progress(enabled=True, stream=stream))
    assert "\r" not in stream.getvalue()
    assert [line[20:] for line in stream.getvalue().splitlines()] == [
        "compiling", "step 2/4 loss 0.500", "step 4/4 loss 0.250", "evaluating dev"
    ]


@pytest.mark.parametrize("n, noun, said", [(1, "process", "1 process"), (2, "process", "2 processes"),
                                           (1, "host", "1 host"), (3, "host", "3 hosts"), (0, "host", "0 hosts"),
                                           (1, "local cpu device", "1 local cpu device"),
                                           (8, "local gpu device", "8 local gpu devices")])
def test_a_count_is_said_in_proper_number(n, noun, said):
    assert counted(n, noun) == said
