"""Run as a script: checks that documented command lines still parse, without running them.

Reads a JSON list of [script path, [arguments]] from the file named by argv[1] and runs each script
as `python SCRIPT ARGS` would (its directory first on sys.path, run as __main__), except that the
script's first `ArgumentParser.parse_args` stops it once the arguments parsed (unknown ones are an
error). Prints a JSON list of [script, arguments, what went wrong] for those that did not parse.
One process for all: the imports are paid once, and what the scripts set up (environment, jax)
stays out of pytest's process.
"""

import argparse
import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

_parse_known_args = argparse.ArgumentParser.parse_known_args


class _Parsed(Exception):
    pass


def _parse_args(parser, args=None, namespace=None):
    _, unknown = _parse_known_args(parser, args, namespace)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    raise _Parsed


def parse_failure(script: str, args: list[str]) -> str | None:
    """None if `script` parsed `args`; else why not (its error output, or what happened instead)."""
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
    except _Parsed:
        return None
    except SystemExit as e:
        return f"exit {e.code}: {errors.getvalue().strip()[-500:]}"
    except Exception as e:  # noqa: BLE001 - any failure before the parse is the finding
        return f"{type(e).__name__} before its arguments were parsed: {e}"
    finally:
        sys.path.pop(0)
    return "finished without calling ArgumentParser.parse_args"


if __name__ == "__main__":
    argparse.ArgumentParser.parse_args = _parse_args
    with open(sys.argv[1]) as f:
        commands = json.load(f)
    failures = [[script, args, why] for script, args in commands if (why := parse_failure(script, args))]
    print(json.dumps(failures))
