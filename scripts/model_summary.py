"""Parameter count and FLOPs per second of audio of a Deep Speech 2 config.

    python scripts/model_summary.py --config configs/ds2_tiny.yaml
"""

import argparse

from models.deepspeech2.model import FRAMES_PER_SECOND, ModelConfig, output_lengths
from models.deepspeech2.summary import count_params, flops_per_audio_second


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML file with a model: section")
    args = parser.parse_args()
    config = ModelConfig.from_yaml(args.config)
    print(f"config: {args.config}")
    print(f"model: {config}")
    print(f"params: {count_params(config)}")
    print(f"output frames per second of audio: {output_lengths(config, FRAMES_PER_SECOND)}")
    print(f"forward GFLOPs per second of audio: {flops_per_audio_second(config, training=False) / 1e9:.4f}")
    print(f"training GFLOPs per second of audio (forward + backward): {flops_per_audio_second(config) / 1e9:.4f}")


if __name__ == "__main__":
    main()
