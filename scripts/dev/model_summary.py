"""Parameter count and FLOPs per second of audio of a Deep Speech 2 config.

    python scripts/dev/model_summary.py --config configs/ds2_tiny.yaml
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # models/ lives in the checkout, not the wheel

import models  # noqa: E402,F401  (registers deepspeech2)
from jaxring.engine.experiment import load_config  # noqa: E402
from models.deepspeech2.model import FRAMES_PER_SECOND, output_lengths  # noqa: E402
from models.deepspeech2.summary import count_params, flops_per_audio_second  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiment YAML of a deepspeech2 task")
    args = parser.parse_args()
    config = load_config(args.config, paths_relative_to=ROOT).model
    print(f"config: {args.config}")
    print(f"model: {config}")
    print(f"params: {count_params(config)}")
    print(f"output frames per second of audio: {output_lengths(config, FRAMES_PER_SECOND)}")
    print(f"forward GFLOPs per second of audio: {flops_per_audio_second(config, training=False) / 1e9:.4f}")
    print(f"training GFLOPs per second of audio (forward + backward): {flops_per_audio_second(config) / 1e9:.4f}")


if __name__ == "__main__":
    main()
