"""Speech data pipeline throughput: synthesis, featurisation, and whole batches.

    python scripts/bench/bench_data.py [--utterances 2000] [--batch 32] [--json OUT]

Stages, each timed on its own:
  synthesize   eSpeak corpus generation (utterances/s, one process)
  synthesize/voices  the corpus of several synthesizers (models/deepspeech2/data/voices.py: eSpeak,
               Festival, Flite, Pico; rooms and noise), one process; skipped, saying why, where
               its Debian packages are missing
  featurize    log spectrogram (161) or log-mel bands (fewer) + normalisation of in-memory audio
               (audio seconds/s), for each --num-features in the same run
  read+featurize  decode flac + featurize, one thread (utterances/s)
  batches      BatchIterator end to end, prefetch thread + W loader threads (utterances/s),
               with the padding fraction of its batches (time padded to 64 frames)
  padding      padding fraction of a shuffled, bucketed epoch for other padding multiples
"""

import argparse
import json
import os
import platform
import sys
import tempfile


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from models.deepspeech2.data import audio, features, manifest, synth, voices  # noqa: E402
from models.deepspeech2.data.batching import BatchIterator, epoch_batches, round_up  # noqa: E402
from models.deepspeech2.data.dataset import SpeechDataset  # noqa: E402
from jaxring.engine.timing import median_seconds  # noqa: E402


def timed(fn, repeats):
    """Median wall time of fn() over `repeats` runs (no warm-up: the first run counts)."""
    return median_seconds(fn, repeats, warmup=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--utterances", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32, help="global batch (one device)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=None, help="corpus cache folder (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the records here")
    parser.add_argument("--num-features", type=int, nargs="+", default=[161, 40],
                        help="featurize stage: the model's num_features to time (161: the spectrogram)")
    args = parser.parse_args()

    records = []

    def record(stage, seconds, utterances, audio_seconds, **extra):
        records.append({"stage": stage, "seconds": round(seconds, 4), "utterances": utterances,
                        "utterances_per_s": round(utterances / seconds, 1),
                        "audio_s_per_s": round(audio_seconds / seconds, 1), **extra})

    def time_synthesis(stage, corpus_module, utterances, scratch):
        """One process generating a corpus of `utterances` with corpus_module.generate_corpus."""
        out = tempfile.mkdtemp(dir=scratch)
        seconds = timed(lambda: corpus_module.generate_corpus(out, utterances, seed=1, workers=1), 1)
        spoken = sum(u.duration for split in corpus_module.SPLITS
                     for u in manifest.read_manifest(os.path.join(out, f"{split}.jsonl")))
        record(stage, seconds, utterances, spoken, workers=1)

    with tempfile.TemporaryDirectory() as scratch:
        time_synthesis("synthesize", synth, min(args.utterances, 300), scratch)
        absent = voices.missing()
        if absent:
            print(f"# synthesize/voices not timed: {', '.join(absent)} not installed ({voices.INSTALL})")
        else:
            time_synthesis("synthesize/voices", voices, min(args.utterances, 200), scratch)

        corpus = synth.ensure_synthetic_corpus(args.cache or scratch, args.utterances, seed=0)
        utterances = manifest.read_manifest(os.path.join(corpus, "train.jsonl"))
        dataset = SpeechDataset(utterances)
        total_audio = float(dataset.durations.sum())

        clips = [audio.read_audio(path)[0] for path in dataset.paths[:500]]
        clip_seconds = sum(len(c) for c in clips) / audio.SAMPLE_RATE
        for num_features in args.num_features:
            seconds = timed(lambda: [features.featurize(c, num_features) for c in clips], args.repeats)
            record(f"featurize/{num_features}", seconds, len(clips), clip_seconds, workers=1,
                   num_features=num_features)

        seconds = timed(lambda: [dataset.load(i) for i in range(len(dataset))], 1)
        record("read+featurize", seconds, len(dataset), total_audio, workers=1)

        for workers in (1, 2):
            def epoch():
                nonlocal padding
                with BatchIterator(dataset, per_device_batch=args.batch, num_epochs=1,
                                   sortagrad=False, workers=workers) as batches:
                    frames = padded = 0
                    for batch in batches:
                        frames += int(batch["feature_lengths"].sum())
                        padded += batch["feature_lengths"].size * batch["features"].shape[2]
                padding = 1 - frames / padded

            padding = 0.0
            used = (len(dataset) // args.batch) * args.batch
            seconds = timed(epoch, args.repeats)
            record("batches", seconds, used, total_audio * used / len(dataset),
                   workers=workers, batch=args.batch, padding_fraction=round(padding, 4))

        # Padding of a shuffled, length-bucketed epoch by time-padding multiple (from
        # metadata only: the frames each utterance will have).
        batches = epoch_batches(dataset.durations, 1, seed=0, global_batch=args.batch)
        for multiple in (1, 16, 32, 64):
            padded = sum(len(b) * round_up(int(dataset.expected_frames[b].max()), multiple)
                         for b in batches)
            real = sum(int(dataset.expected_frames[b].sum()) for b in batches)
            records.append({"stage": "padding", "pad_frames_to": multiple, "batch": args.batch,
                            "padding_fraction": round(1 - real / padded, 4)})

    header = f"{'stage':18} {'workers':>7} {'utt/s':>9} {'audio s/s':>10} {'padding':>8}"
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, {args.utterances} utterances")
    print(header)
    for r in records:
        if r["stage"] == "padding":
            print(f"padding, time padded to a multiple of {r['pad_frames_to']} frames: "
                  f"{r['padding_fraction']:.1%}")
            continue
        padding = f"{r['padding_fraction']:.1%}" if "padding_fraction" in r else ""
        print(f"{r['stage']:18} {r['workers']:>7} {r['utterances_per_s']:>9.1f} "
              f"{r['audio_s_per_s']:>10.1f} {padding:>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
