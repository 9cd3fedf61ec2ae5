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
"""

import argparse
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="A task may add options of its own: --workdir RUN --help lists them.")
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory of scripts/train.py")
    parser.add_argument("--split", default="test", help="the split of the run's data to score (default: test)")
    parser.add_argument("--checkpoint", default="best",
                        help="best (by the run's checkpoint.best_metric), latest or a step number")
    parser.add_argument("--batch-size", type=int, help="default: the run's eval.batch_size")

    import models
    from jaxring.engine.checkpoint import CheckpointError
    from jaxring.engine.task import Task

    try:
        add_task_arguments(parser, argv)
        args = parser.parse_args(argv)
        config, task, variables, step = models.load_run(args.workdir, args.checkpoint)
        score = getattr(task, "evaluate", None) or functools.partial(Task.evaluate, task)  # the contract's default
        result, failure = score(args, config, variables)
    except (FileNotFoundError, CheckpointError, ValueError) as e:  # ValueError: ConfigError, DataError among them
        sys.exit(f"error: {e}")
    result = {**result, "step": step}
    print(json.dumps(result))
    if failure:
        sys.exit(f"error: {failure}")
    return result


def add_task_arguments(parser, argv) -> None:
    """The options of the task that trained --workdir, when it has any (read before the rest is parsed)."""
    from jaxring.engine import config as config_lib
    from jaxring.engine import tasks

    workdir = argparse.ArgumentParser(add_help=False)
    workdir.add_argument("--workdir", type=Path)
    run = workdir.parse_known_args(argv)[0].workdir
    if run is None or not (run / "config.yaml").is_file():
        return  # parse_args, then load_run, name what is missing
    add = getattr(tasks.task_class(config_lib.task_name(run / "config.yaml")), "add_evaluate_arguments", None)
    if add is not None:
        add(parser)


if __name__ == "__main__":
    main()
