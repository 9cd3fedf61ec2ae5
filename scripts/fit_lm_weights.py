"""Fits the beam search's LM weight alpha and word bonus beta on dev by grid search.

    python scripts/fit_lm_weights.py --workdir runs/ds2_tiny --lm runs/ds2_tiny/lm.arpa
    python scripts/fit_lm_weights.py --workdir runs/ds2_tiny --lm words3.arpa --alphas 0.3,0.6,1 --betas 0,1,2

The model runs once over the dev utterances; each (alpha, beta) then only decodes again.
Prints a table (best last) and the --set flags for the config; --json writes the grid.
"""

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory of scripts/train.py")
    parser.add_argument("--lm", required=True, help="ARPA language model")
    parser.add_argument("--alphas", type=floats, default=floats("0.25,0.5,0.75,1,1.5"))
    parser.add_argument("--betas", type=floats, default=floats("0,0.5,1,2"))
    parser.add_argument("--beam-width", type=int, default=16)
    parser.add_argument("--split", default="dev", choices=["train", "dev", "test"],
                        help="fit on this split (dev: test stays unseen)")
    parser.add_argument("--max-utterances", type=int, default=300, help="first N utterances of the split")
    parser.add_argument("--metric", default="wer", choices=["cer", "wer"], help="what the best setting minimises")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--json", type=Path, help="write the grid and the best setting here")
    args = parser.parse_args(argv)
    if args.beam_width < 1:
        parser.error(f"--beam-width must be at least 1, got {args.beam_width}")

    import jax
    import numpy as np

    import models  # noqa: F401  (registers deepspeech2)
    from jaxring.engine.devices import split_sources
    from jaxring.engine.experiment import load_run
    from jaxring.engine.task import Shard
    from models.deepspeech2 import beam_scoring
    from models.deepspeech2.lm import ArpaLM

    try:
        config, task, variables, _ = load_run(args.workdir, args.checkpoint, ROOT)
        lm = ArpaLM.read(args.lm)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    predict = jax.jit(task.predict)
    scored = []  # (outputs, batch) of every batch: the model runs once
    for batch in task.manifest_batches(task.manifests[args.split], config.eval.batch_size, Shard(0, 1),
                                       limit=args.max_utterances):
        batch, _ = split_sources(batch)
        outputs = jax.tree_util.tree_map(np.asarray, predict(variables, batch))
        scored.append((outputs, batch))

    def error_rates(decoder) -> dict:
        scorer = copy.copy(task)
        scorer.decoder = decoder
        counts: dict[str, float] = {}
        for outputs, batch in scored:
            for key, value in scorer.score(outputs, batch).items():
                counts[key] = counts.get(key, 0) + value
        return scorer.summarize(counts)

    greedy = error_rates(task.decoder)
    print(f"{args.split}, {greedy['utterances']} utterances; greedy: CER {100 * greedy['cer']:.2f}% "
          f"WER {100 * greedy['wer']:.2f}%", flush=True)
    grid = []
    for alpha in args.alphas:
        for beta in args.betas:
            rates = error_rates(beam_scoring.beam_decoder(args.beam_width, lm, alpha, beta))
            grid.append({"alpha": alpha, "beta": beta, "cer": rates["cer"], "wer": rates["wer"]})
    def rank(row):
        return row[args.metric], row["cer" if args.metric == "wer" else "wer"]

    best = min(grid, key=rank)  # ties: the first in grid order
    print(f"{'alpha':>6} {'beta':>6} {'CER %':>7} {'WER %':>7}")
    for row in sorted(grid, key=rank, reverse=True):
        print(f"{row['alpha']:6.2f} {row['beta']:6.2f} {100 * row['cer']:7.2f} {100 * row['wer']:7.2f}")
    print(f"best by {args.metric}: --set decode.alpha={best['alpha']} --set decode.beta={best['beta']} "
          f"(evaluate.py: --alpha {best['alpha']} --beta {best['beta']})")
    result = {"split": args.split, "utterances": greedy["utterances"], "beam_width": args.beam_width,
              "lm": args.lm, "greedy": {k: greedy[k] for k in ("cer", "wer")}, "grid": grid, "best": best}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
