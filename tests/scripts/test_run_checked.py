"""scripts/run_checked.py: a launch that says 0 without a finished run's last line fails."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxring.engine.report import FINISHED_MARKER

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_checked.py"


def launch(program, *flags):
    """run_checked.py over `python -c program`: (exit status, stdout, stderr)."""
    run = subprocess.run([sys.executable, str(SCRIPT), *flags, sys.executable, "-c", program],
                         capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout, run.stderr


def test_a_finished_run_passes_with_its_output():
    code, out, _ = launch(f"print('step 1'); print('test CER 12.3%; 1 s{FINISHED_MARKER}runs/x')")
    assert code == 0
    assert out == f"step 1\ntest CER 12.3%; 1 s{FINISHED_MARKER}runs/x\n"


@pytest.mark.parametrize("flags", [(), ("--",)])
def test_status_0_without_the_last_line_is_a_failure_that_says_what_to_do(flags):
    # What mpirun did after losing a node: status 0, the run's output cut short.
    code, out, err = launch("print('step 1')", *flags)
    assert code == 1
    assert out == "step 1\n"
    assert "exited with status 0, but no process printed a finished run's last line" in err
    assert "--resume once every node is back" in err


def test_output_held_open_by_a_child_of_the_launch_does_not_hold_up_the_verdict():
    # A launch whose child keeps the output pipe (as an ssh client to a lost node can) for a minute.
    started = time.monotonic()
    code, _, err = launch("import subprocess; subprocess.Popen(['sleep', '60'], stderr=subprocess.DEVNULL); "
                          "print('step 1')")
    assert code == 1 and "the run did not finish" in err
    assert time.monotonic() - started < 30


def test_a_failed_launch_keeps_its_status():
    assert launch("import sys; print('x'); sys.exit(3)")[0] == 3
    assert launch("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")[0] == 128 + 9


def test_no_command_is_a_usage_error():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "give the launch command" in run.stderr
