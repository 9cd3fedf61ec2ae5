"""Run as a script: runs the docs' command lines in the current directory and says how each ended.

Reads a JSON list of {"line": shell line, "script": path or null, "args": [...]} from the file named
by argv[1]. A line with a script (a `python SCRIPT ... --help`) runs in this process, as `python
SCRIPT ARGS` would (its directory first on sys.path, run as __main__): those scripts import jax and
their help is all that is asked of them, so the imports are paid once. Any other line runs under
bash, as a reader's shell would. Prints a JSON list of [line, exit status, the output's tail].
"""

import contextlib
import io
import json
import runpy
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 240
TAIL = 1500


def run_in_process(script: str, args: list[str]) -> tuple[int, str]:
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            output.write(str(e.code))
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        output.write(f"{type(e).__name__}: {e}")
        code = 1
    finally:
        sys.path.pop(0)
    return code, output.getvalue()


def run_in_shell(line: str) -> tuple[int, str]:
    try:
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return 124, f"still running after {TIMEOUT_S} s: {e.stdout or ''}{e.stderr or ''}"
    return done.returncode, done.stdout + done.stderr


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        commands = json.load(f)
    results = []
    for command in commands:
        if command["script"]:
            code, output = run_in_process(command["script"], command["args"])
        else:
            code, output = run_in_shell(command["line"])
        results.append([command["line"], code, output[-TAIL:]])
    print(json.dumps(results))
