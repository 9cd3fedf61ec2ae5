"""examples/nnx_classifier's whole config over seeds, on two shapes: 1 process x 2 host devices and 2 processes x 1.

    python scripts/bench/nnx_classifier_shapes.py --seeds 0 1 2 --json docs/bench/nnx-classifier-shapes-2026-12-03.json

Each seed trains the NNX classifier (BatchNorm, Dropout; jaxring/engine/nnx_task.py)
and examples/classifier's linen MLP, for reference, with scripts/train.py. Both
shapes number the same two replicas, and each replica's dropout stream comes
from train.seed and its global index, so the two shapes must end with the same
checkpoint bit for bit. Prints a table; writes the summaries, the comparison
and the commands as JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jaxring.engine.checkpoint import LATEST, Checkpoints  # noqa: E402

PYTHON = sys.executable
MPIRUN = str(Path(PYTHON).parent / "mpirun")
CONFIGS = {"nnx": ROOT / "examples" / "nnx_classifier" / "nnx_classifier.yaml",
           "linen": ROOT / "examples" / "classifier" / "classifier.yaml"}


def command(config: Path, workdir: Path, seed: int, processes: int) -> list[str]:
    train = [str(ROOT / "scripts" / "train.py"), "--config", str(config), "--workdir", str(workdir),
             "--set", f"train.seed={seed}"]
    if processes == 1:
        return [PYTHON, *train, "--host-devices", "2"]
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "2",
            "-x", "XLA_FLAGS", "-x", "PYTHONPATH", "-x", "JAX_PLATFORMS", PYTHON, "-m", "mpi4py", *train]


def train(config: Path, workdir: Path, seed: int, processes: int) -> tuple[dict, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "XLA_FLAGS"))}
    env.update(PYTHONPATH=str(ROOT / "examples"), JAX_PLATFORMS="cpu")
    if processes > 1:  # one device each; a single process gets its two from --host-devices
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    argv = command(config, workdir, seed, processes)
    subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return json.loads((workdir / "summary.json").read_text()), argv


def same_checkpoints(a: Path, b: Path) -> bool:
    """Whether the last checkpoints of runs `a` and `b` hold the same arrays, bit for bit."""
    states = [Checkpoints(run / "checkpoints").read(LATEST).state for run in (a, b)]
    flat = [dict(_flat(state)) for state in states]
    return flat[0].keys() == flat[1].keys() and all(
        flat[0][k].dtype == flat[1][k].dtype and np.array_equal(flat[0][k], flat[1][k]) for k in flat[0])


def _flat(tree, path=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat(value, f"{path}/{key}")
    else:
        yield path, np.asarray(tree)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args()
    rows, commands = [], []
    print("| seed | model | shape | test error | dev error (best) | final loss | same checkpoint as 1x2 |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="i60-nnx-shapes-") as scratch:
        for seed in args.seeds:
            for model, config in CONFIGS.items():
                runs = {}
                for processes in (1, 2):
                    workdir = Path(scratch) / f"{model}-{seed}-{processes}"
                    summary, argv = train(config, workdir, seed, processes)
                    runs[processes] = workdir
                    commands.append(" ".join(argv))
                    same = same_checkpoints(runs[1], workdir) if processes == 2 else None
                    row = {"seed": seed, "model": model, "processes": processes,
                           "local_devices": summary["local_devices"], "test_error_rate": summary["test_error_rate"],
                           "dev_error_rate": summary["dev_error_rate"], "loss": summary["loss"],
                           "same_checkpoint_as_one_process": same}
                    rows.append(row)
                    print(f"| {seed} | {model} | {processes}x{summary['local_devices']} | "
                          f"{100 * row['test_error_rate']:.2f}% | {100 * row['dev_error_rate']:.2f}% | "
                          f"{row['loss']:.4f} | {'' if same is None else same} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "commands": commands}, indent=1) + "\n")


if __name__ == "__main__":
    main()
