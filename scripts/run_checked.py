"""Run a training launch and exit non-zero unless the run finished, whatever the launcher says.

When a node is lost, Open MPI 5's mpirun (PRRTE) ends the job itself and its
exit status was 0 in 3 of 20, 9 of 10 and 26 of 30 such trials here
(docs/TRAINING.md, "A lost node can end mpirun with exit status 0"): a
scheduler that trusts it sees success. scripts/train.py prints its last line
(jaxring/engine/report.py) only once the run finished and its summary is
written, and mpirun forwards process 0's output to the launch node, so this
passes the launch's output through and checks that the line went by; no
shared filesystem needed.

    python scripts/run_checked.py mpirun -np 2 python -m mpi4py scripts/train.py --config C --workdir W

Exit status: the launcher's when it failed; 1 when it said 0 but the run did
not finish; 0 when it finished.
"""

import argparse
import signal
import subprocess
import sys
import threading

from jaxring.engine.report import FINISHED_MARKER

# After the launcher exits, how long its output may take to drain: its children can hold the
# pipe open for minutes (an ssh client to a lost node), so the end of the output is not waited for.
DRAIN_S = 2.0


def pass_through(output, seen: dict) -> None:
    for line in output:
        sys.stdout.write(line)
        sys.stdout.flush()
        seen["finished"] = seen["finished"] or FINISHED_MARKER in line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], usage="%(prog)s LAUNCH_COMMAND ...")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the launch, e.g. mpirun ... scripts/train.py ...")
    command = parser.parse_args(argv).command
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        parser.error("give the launch command, e.g. mpirun -np 2 python -m mpi4py scripts/train.py --config C")
    launch = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    signal.signal(signal.SIGTERM, lambda signum, frame: launch.send_signal(signum))  # a scheduler's stop
    seen = {"finished": False}
    reader = threading.Thread(target=pass_through, args=(launch.stdout, seen), daemon=True)
    reader.start()
    try:
        code = launch.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the launch too (one process group): let it end
        code = launch.wait()
    reader.join(DRAIN_S)
    if code != 0:
        return 128 - code if code < 0 else code
    if not seen["finished"]:
        print(f"run_checked.py: {command[0]} exited with status 0, but no process printed a finished run's "
              f"last line ('...{FINISHED_MARKER}...'): the run did not finish. If a node was lost, continue "
              "with the same command and --resume once every node is back.", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
