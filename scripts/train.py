"""Trains the task an experiment config names with jaxring's synchronous data-parallel SGD.

    python scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/ds2_tiny
    python scripts/train.py --config examples/classifier/classifier.yaml --host-devices 2
    python scripts/train.py --config configs/ds2_tiny.yaml --set optim.learning_rate=1e-3 --allreduce psum
    python scripts/train.py --workdir runs/ds2_tiny --resume
    python scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/ds2_tiny --overwrite
    mpirun -np 2 python -m mpi4py scripts/train.py --config configs/ds2_tiny.yaml --workdir runs/mpi

The config's `task:` names the model: a registered name (deepspeech2), an
installed package's entry point, or an import path package.module:Class
(docs/YOUR_MODEL.md). The run directory (default: runs/<config name> in the
current directory) gets config.yaml (the resolved config), metrics.jsonl,
summary.json, data_report.json, checkpoints/, plots/ and TensorBoard events.
A directory that holds checkpoints needs --resume or --overwrite
(jaxring/engine/rundir.py). Under mpirun, an error on any process ends the job.

This is jaxring-train (jaxring/engine/cli.py) with the checkout's tasks
registered and the relative paths of its configs meaning paths in the checkout.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402,F401  (registers the checkout's tasks)
from jaxring.engine import cli  # noqa: E402


def main(argv=None) -> dict:
    return cli.train(argv, paths_relative_to=ROOT)


if __name__ == "__main__":
    main()
