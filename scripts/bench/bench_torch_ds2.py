"""Deep Speech 2's training step in PyTorch with cuDNN's recurrent layers: docs/PERSISTENT_RNN.md's baseline.

    python scripts/bench/bench_torch_ds2.py --config ds2_paper --dtype bfloat16 --batch-size 64 --seconds 4

The same shapes as models/deepspeech2/model.py for a config's `model:` section:
its convolutions (kernels, strides, channels), batch norm, clipped ReLU, its
recurrent layers as one nn.GRU (or nn.RNN) per layer, directions summed, the
output layer and CTC loss, SGD with Nesterov momentum. Batch norm sits on the
recurrent layer's input, where cuDNN allows it (jaxring normalises the input
projection). Times forward + backward + update on one fixed random batch, as
scripts/bench/bench_train.py does for jaxring; bfloat16 under autocast (parameters
float32, as jaxring's compute dtype).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def build_model(torch, model_config):
    """The PyTorch twin of DeepSpeech2(model_config), as an nn.Module: [B, 1, F, T] -> [T', B, 29]."""
    from torch import nn

    from models.deepspeech2 import alphabet
    from models.deepspeech2.model import strided_length

    cfg = model_config

    class TorchDeepSpeech2(nn.Module):
        def __init__(self):
            super().__init__()
            convs, channels, bins = [], 1, cfg.num_features
            for index in range(cfg.conv_layers):
                (freq_kernel, time_kernel), (freq_stride, time_stride) = cfg.conv_geometry(index)
                convs += [nn.Conv2d(channels, cfg.conv_channels[index], (freq_kernel, time_kernel),
                                    (freq_stride, time_stride), (freq_kernel // 2, time_kernel // 2), bias=False),
                          nn.BatchNorm2d(cfg.conv_channels[index]), nn.Hardtanh(0, cfg.relu_clip)]
                channels, bins = cfg.conv_channels[index], strided_length(bins, freq_stride)
            self.convs = nn.Sequential(*convs)
            recurrent = nn.GRU if cfg.rnn_cell == "gru" else nn.RNN
            extra = {} if cfg.rnn_cell == "gru" else {"nonlinearity": "relu"}
            sizes = [channels * bins] + [cfg.rnn_hidden] * (cfg.rnn_layers - 1)
            self.norms = nn.ModuleList(nn.BatchNorm1d(size) for size in sizes)
            self.rnns = nn.ModuleList(recurrent(size, cfg.rnn_hidden, bidirectional=cfg.bidirectional, **extra)
                                      for size in sizes)
            self.output = nn.Linear(cfg.rnn_hidden, alphabet.SIZE)

        def forward(self, x):
            x = self.convs(x)  # [B, C, F', T']
            x = x.flatten(1, 2).permute(2, 0, 1)  # [T', B, C * F']
            for norm, rnn in zip(self.norms, self.rnns):
                frames, batch, _ = x.shape
                x = norm(x.reshape(frames * batch, -1)).reshape(frames, batch, -1)
                x, _ = rnn(x)
                if cfg.bidirectional:
                    x = x.view(frames, batch, 2, -1).sum(dim=2)
            return self.output(x)

    return TorchDeepSpeech2()


def bench_torch(model_config, batch: dict, dtype: str, steps: int, device: str = "cuda") -> dict:
    """Median seconds of one training step of the PyTorch twin on `batch` (bench_train.random_batch's dict)."""
    import torch

    torch.backends.cudnn.benchmark = True
    model = build_model(torch, model_config).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=3e-4, momentum=0.99, nesterov=True)
    features = torch.from_numpy(batch["features"]).to(device).permute(0, 2, 1).unsqueeze(1)  # [B, 1, F, T]
    labels = torch.from_numpy(batch["labels"]).to(device)
    label_lengths = torch.from_numpy(batch["label_lengths"]).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(features)
        log_probs = logits.float().log_softmax(-1)
        frames = torch.full((log_probs.shape[1],), log_probs.shape[0], dtype=torch.int32, device=device)
        loss = torch.nn.functional.ctc_loss(log_probs, labels, frames, label_lengths, blank=0, zero_infinity=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def timed_step():
        start = time.perf_counter()
        loss = step()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, loss

    warmup_s = sum(timed_step()[0] for _ in range(3))  # cuDNN's algorithm search, the allocator's first sizes
    times, losses = zip(*(timed_step() for _ in range(steps)))
    on_cuda = device == "cuda"
    return {"impl": "torch-cudnn" if on_cuda else "torch", "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if on_cuda else None,
            "device": torch.cuda.get_device_name() if on_cuda else device, "dtype": dtype,
            "global_batch": len(batch["features"]), "warmup_s": warmup_s, "step_s": statistics.median(times),
            "last_loss": float(losses[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="ds2_paper")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import models  # noqa: F401  (registers deepspeech2)
    from bench_train import random_batch

    from jaxring.engine.experiment import load_config

    config = load_config(ROOT / "configs" / f"{args.config}.yaml", [f"model.dtype={args.dtype}"], ROOT)
    record = {"config": args.config, **bench_torch(config.model, random_batch(args.batch_size, args.seconds),
                                                   args.dtype, args.steps)}
    print(json.dumps(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
