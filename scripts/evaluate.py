"""Scores a trained run again with its task's metrics: JSON on stdout.

    python scripts/evaluate.py --workdir runs/classifier --split dev
    python scripts/evaluate.py --workdir runs/ds2_tiny                    # test split of its corpus
    python scripts/evaluate.py --workdir runs/ds2_tiny --manifest other.jsonl
    python scripts/evaluate.py --workdir runs/ds2_tiny --beam-width 16 --lm runs/ds2_tiny/lm.arpa --alpha 0.5 --beta 1
    python scripts/evaluate.py --workdir runs/ds2_tiny_voices --split train --by synthesizer --per-group 400

By default it scores a split of the run's data as training did (the task's
eval_batches, predict, score and summarize, jaxring/engine/task.py). A task
may bring options and a scoring of its own (the contract's optional
add_evaluate_arguments and evaluate): `--workdir RUN --help` lists them.
Deep Speech 2's (models/deepspeech2/evaluation.py) score a manifest, by
groups of a manifest field, greedily or by beam search with an LM; an
utterance it cannot score is named on stderr and the exit status is then 1.

This is jaxring-evaluate (jaxring/engine/cli.py) with the checkout's tasks
registered and the relative paths of its configs meaning paths in the checkout.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402,F401  (registers the checkout's tasks)
from jaxring.engine import cli  # noqa: E402


def main(argv=None) -> dict:
    return cli.evaluate(argv, paths_relative_to=ROOT)


if __name__ == "__main__":
    main()
