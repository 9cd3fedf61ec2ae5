"""Deep Speech 2 as a jaxring training task: init, CTC loss, greedy-decoded CER/WER, speech batches.

The engine (jaxring.engine) is model-agnostic; this adapter meets its Task
contract (jaxring/engine/task.py) with what is specific to speech. Experiment configs get two sections from here: `model`
(models.deepspeech2.model.ModelConfig) and `data` (DataConfig below).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.engine.checkpoint import load_variables
from jaxring.engine.config import ConfigPath
from jaxring.engine.task import AXIS, SOURCES, MetricNames, Shard
from models.deepspeech2 import alphabet, ctc, ctc_decoders, evaluation, metrics
from models.deepspeech2 import model as ds2
from models.deepspeech2.augment import AugmentConfig, augment
from models.deepspeech2.data import AudioError, BatchIterator, DataError, SpeechDataset, ensure_synthetic_corpus
from models.deepspeech2.data import Problems, featurize, read_audio, read_manifest
from models.deepspeech2.data.features import NUM_BINS
from models.deepspeech2.data import problems as P
from models.deepspeech2.data import voices
from models.deepspeech2.beam_scoring import DecodeConfig, lm_test_scores, score_manifest

SPLITS = ("train", "dev", "test")
SYNTHESIZED = {"synthetic": ensure_synthetic_corpus, "voices": voices.ensure_voices_corpus}  # data.corpus -> maker
# Test splits that some corpora add, scored greedily at the end beside test: split -> what the report calls it.
EXTRA_TESTS = {"test_espeak": "eSpeak held-out voices"}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The `data:` section: which corpus, and how it is cut into batches."""

    corpus: str | None = None  # "synthetic" (eSpeak NG, generated on first use) | "voices" (several
    # synthesizers, models/deepspeech2/data/voices.py) | "manifest";
    # None: "manifest" when manifest_dir or the split manifests are set, else "synthetic"
    cache_dir: ConfigPath = "data/cache"  # synthetic: where the corpus is generated
    utterances: int = 2000  # synthetic, voices: all splits together
    corpus_seed: int = 0  # synthetic, voices
    manifest_dir: ConfigPath | None = None  # manifest: a folder with train.jsonl, dev.jsonl, test.jsonl
    train_manifest: ConfigPath | None = None  # manifest: JSON-lines files (instead of manifest_dir)
    dev_manifest: ConfigPath | None = None  # manifest: the dev split's JSON-lines file
    test_manifest: ConfigPath | None = None  # manifest: the test split's JSON-lines file
    max_duration: float | None = None  # seconds; longer training utterances are skipped
    max_unusable_share: float = 0.1  # a split with more unusable utterances than this stops the run (1: never)
    sortagrad: bool = True  # first epoch in increasing length
    pad_frames_to: int = 64  # batch lengths are rounded up to this (fewer distinct shapes to compile)
    pad_labels_to: int = 16  # label lengths are rounded up to this, as pad_frames_to for frames
    prefetch: int = 4  # batches loaded ahead of the training step
    workers: int = 2  # audio-loading threads

    def __post_init__(self):
        split_keys = [f"data.{s}_manifest" for s in SPLITS]
        given = [key for key in split_keys if getattr(self, key.split(".")[1]) is not None]
        if self.corpus not in (None, *SYNTHESIZED, "manifest"):
            raise ValueError(f"data.corpus must be 'synthetic' or 'manifest', or 'voices' (several synthesizers); "
                             f"got {self.corpus!r}")
        if self.corpus in SYNTHESIZED and (self.manifest_dir or given):
            raise ValueError(f"data.corpus is {self.corpus!r} but {', '.join(given or ['data.manifest_dir'])} "
                             "set; drop data.corpus (or set it to 'manifest') to train on manifests")
        if self.manifest_dir is not None and given:
            raise ValueError(f"data.manifest_dir and {', '.join(given)} are both set; give one or the other")
        if self.source == "manifest" and self.manifest_dir is None and len(given) < len(SPLITS):
            missing = [key for key in split_keys if key not in given]
            raise ValueError(f"data.corpus is 'manifest' but {', '.join(missing)} not set "
                             "(or set data.manifest_dir to a folder with train/dev/test.jsonl)")

        if not 0 <= self.max_unusable_share <= 1:
            raise ValueError(f"data.max_unusable_share must be in [0, 1]; got {self.max_unusable_share!r}")

    @property
    def source(self) -> str:
        """Where the utterances come from: "synthetic", "voices" or "manifest"."""
        if self.corpus is not None:
            return self.corpus
        given = self.manifest_dir is not None or any(getattr(self, f"{s}_manifest") for s in SPLITS)
        return "manifest" if given else "synthetic"

    def describe(self) -> str:
        """What the test split is, for the final report line."""
        if self.source == "synthetic":
            return "synthetic eSpeak test split, held-out voices"
        if self.source == "voices":
            return f"test split of a synthesizer training never hears (flite {', '.join(voices.FLITE_VOICES['test'])})"
        test = self.test_manifest or os.path.join(self.manifest_dir, "test.jsonl")
        return f"test manifest {test}"


def result_text(summary: dict, test_split: str) -> str:
    """Test CER/WER greedy (and by beam search, if scored) on `test_split`, then dev."""
    line = f"dev CER {100 * summary['dev_cer']:.2f}% WER {100 * summary['dev_wer']:.2f}%"
    if "test_cer" not in summary:
        return line
    test = f"test CER {100 * summary['test_cer']:.2f}% WER {100 * summary['test_wer']:.2f}% (greedy)"
    if "test_beam_cer" in summary:
        how = f"beam {summary['beam_width']}" + (" + LM" if summary["lm"] else "")
        test += f", CER {100 * summary['test_beam_cer']:.2f}% WER {100 * summary['test_beam_wer']:.2f}% ({how})"
    return f"{test} on the {test_split}, checkpoint of step {summary['best_step']}; " + line


class TrainBatches:
    """The engine's view of a BatchIterator: flat [B, ...] arrays, a resumable position."""

    global_order = True  # BatchIterator's order depends on the global batch alone (batching.py)

    def __init__(self, iterator: BatchIterator):
        self._iterator = iterator
        self.steps_per_epoch = iterator.batches_per_epoch

    def state(self) -> dict:
        return self._iterator.state()

    def restore(self, state: dict) -> None:
        self._iterator.restore(state)

    def __iter__(self) -> Iterator[dict]:
        for batch in self._iterator:
            yield _flatten(batch)


def _flatten(batch: dict) -> dict:
    """BatchIterator's [1, B, ...] arrays as [B, ...], and its audio paths; the texts are in the labels too."""
    flat = {k: v.reshape(v.shape[1:]) for k, v in batch.items() if k not in ("texts", "paths")}
    return {**flat, SOURCES: batch["paths"]}


class DeepSpeech2Task:
    """Deep Speech 2 trained by CTC and scored by greedy decoding (or self.decoder)."""

    config_sections = {"model": ds2.ModelConfig, "data": DataConfig, "augment": AugmentConfig, "decode": DecodeConfig}
    metrics = MetricNames(best="wer", plotted=("cer", "wer"), shown=("cer",), label="dev error rate (%)",
                          percent=("cer", "wer"))

    def __init__(self, model: ds2.ModelConfig, data: DataConfig, augmentation: AugmentConfig = AugmentConfig()):
        if model.num_features > NUM_BINS:
            raise ValueError(f"model.num_features must be at most {NUM_BINS} (the spectrogram's bins; fewer "
                             f"are mel bands, models/deepspeech2/data/features.py), got {model.num_features}")
        self.model_config = model
        self.data = data
        self.augmentation = augmentation
        # (logits, lengths) -> transcripts; greedy while training, a beam search (see
        # models/deepspeech2/beam_scoring.py) when scoring with a language model
        self.decoder = ctc_decoders.greedy_decode
        self.network = ds2.DeepSpeech2(model)
        # Training computes batch-norm statistics over all local devices together, so
        # N devices at B/N per device normalise exactly like one device at B.
        self.train_network = ds2.DeepSpeech2(model, axis_name=AXIS)

    @classmethod
    def from_config(cls, config) -> DeepSpeech2Task:
        return cls(config.model, config.data, config.augment)

    # -- corpus

    @functools.cached_property
    def manifests(self) -> dict[str, str]:
        """Manifest path of each split (generating the synthetic corpus on first use)."""
        if self.data.source == "manifest":
            if self.data.manifest_dir is not None:
                return {s: self._split_manifest(s) for s in SPLITS}
            return {s: getattr(self.data, f"{s}_manifest") for s in SPLITS}
        folder = SYNTHESIZED[self.data.source](self.data.cache_dir, self.data.utterances, self.data.corpus_seed)
        extra = [s for s in EXTRA_TESTS if (Path(folder) / f"{s}.jsonl").is_file()]
        return {s: str(Path(folder) / f"{s}.jsonl") for s in (*SPLITS, *extra)}

    def _split_manifest(self, split: str) -> str:
        path = os.path.join(self.data.manifest_dir, f"{split}.jsonl")
        if not os.path.isfile(path):
            raise DataError(
                f"data.manifest_dir {self.data.manifest_dir} has no {split}.jsonl; write the three "
                "manifests with scripts/make_manifest.py --split (see docs/TRAINING.md)")
        return path

    def dataset(self, manifest: str, limit: int | None = None, max_duration: float | None = None,
                problems: Problems | None = None) -> SpeechDataset:
        """The usable utterances of `manifest`; DataError when too many are not (data.max_unusable_share).

        `problems`: where the skipped ones are counted (default: a new Problems).
        """
        output_frames = functools.partial(ds2.output_lengths, self.model_config)
        problems = problems or Problems()
        utterances = read_manifest(manifest, problems)
        return SpeechDataset(
            utterances[:limit], max_duration=max_duration, output_frames=output_frames, problems=problems,
            max_unusable_share=self.data.max_unusable_share, name=f"manifest {manifest}",
            entries=len(utterances[:limit]) + problems.skipped,  # lines that made no utterance count too
            num_features=self.model_config.num_features,
        )

    def check_data(self) -> dict:
        """Every split read and checked before training: {split: {"summary", "utterances", "usable", "skipped"}}."""
        report = {}
        for split in SPLITS:
            dataset = self.dataset(self.manifests[split], max_duration=self.data.max_duration if split == "train" else None)
            report[split] = {
                "summary": f"{split}: {len(dataset)} of {dataset.total} utterances usable, "
                + dataset.problems.summary(),
                "manifest": self.manifests[split],
                "utterances": dataset.total,
                "usable": len(dataset),
                "skipped": dataset.problems.report(),
            }
        return report

    # -- the engine's Task protocol

    def init(self, rng) -> dict:
        return ds2.init_variables(self.model_config, rng)

    def loss(self, variables, batch, rng):
        features = augment(self.augmentation, rng, batch["features"], batch["feature_lengths"])
        (logits, out_lengths), updates = self.train_network.apply(
            variables, features, batch["feature_lengths"], train=True, mutable=["batch_stats"]
        )
        per_utterance, feasible = ctc.ctc_loss(logits, out_lengths, batch["labels"], batch["label_lengths"])
        weights = batch["weights"] * feasible
        return jnp.sum(per_utterance * weights) / jnp.maximum(jnp.sum(weights), 1.0), updates

    def predict(self, variables, batch):
        logits, out_lengths = self.network.apply(variables, batch["features"], batch["feature_lengths"], train=False)
        return {"logits": logits, "lengths": out_lengths}

    def score(self, outputs, batch) -> dict[str, float]:
        real = np.flatnonzero(batch["weights"] > 0)
        if not len(real):
            return {}
        hyps = self.decoder(outputs["logits"][real], outputs["lengths"][real])
        refs = [alphabet.decode(batch["labels"][i, : batch["label_lengths"][i]]) for i in real]
        return {**metrics.edit_counts(refs, hyps), "utterances": len(real)}

    def summarize(self, counts: dict[str, float]) -> dict[str, float]:
        return {**metrics.error_rates(counts), "utterances": int(counts["utterances"])}

    def _batches(self, dataset: SpeechDataset, batch_size: int, shard: Shard, **order) -> BatchIterator:
        d = self.data
        return BatchIterator(
            dataset,
            per_device_batch=batch_size,
            process_index=shard.index,
            process_count=shard.count,
            pad_frames_to=d.pad_frames_to,
            pad_labels_to=d.pad_labels_to,
            prefetch=d.prefetch,
            workers=d.workers,
            **order,
        )

    def train_batches(self, batch_size: int, shard: Shard, seed: int) -> TrainBatches:
        dataset = self.dataset(self.manifests["train"], max_duration=self.data.max_duration)
        # The metadata checks are in check_data's report; what fails only when loaded is printed as it comes.
        dataset.problems.on_skip = lambda line: print(f"data: skipped {line}", flush=True)
        return TrainBatches(self._batches(dataset, batch_size, shard, seed=seed, sortagrad=self.data.sortagrad))

    def eval_batches(self, split: str, batch_size: int, shard: Shard, limit: int | None = None):
        return self.manifest_batches(self.manifests[split], batch_size, shard, limit)

    def manifest_batches(self, manifest: str, batch_size: int, shard: Shard, limit: int | None = None,
                         problems: Problems | None = None):
        """One pass over `manifest` in increasing length (little padding), every usable utterance once.

        `problems`: where the skipped ones are counted (default: a new Problems).
        """
        per_process = -(-batch_size // shard.count)
        order = dict(shuffle=False, sortagrad=False, drop_last=False, num_epochs=1)
        dataset = self.dataset(manifest, limit, problems=problems)
        with self._batches(dataset, per_process, shard, **order) as batches:
            for batch in batches:
                yield _flatten(batch)

    # -- the run's final report (the engine's optional hook, jaxring/engine/task.py)

    def final_report(self, config, workdir, summary: dict) -> tuple[dict, str]:
        """Test scored again by the `decode:` section's beam search and LM (when set); the result text."""
        from jaxring.engine.progress import timestamp

        scores = {}
        if config.decode.beam_width and "test_cer" in summary:
            lm = " + LM" if config.decode.lm else ""
            print(f"{timestamp()} scoring test by beam search ({config.decode.beam_width} beams{lm})", flush=True)
            scores = lm_test_scores(self, config, workdir)
        extra = {split: self.manifests[split] for split in EXTRA_TESTS if split in self.manifests}
        if extra and "test_cer" in summary:
            print(f"{timestamp()} scoring {', '.join(extra)} (greedy)", flush=True)
            variables, _ = load_variables(workdir, "best")
            for split, manifest in extra.items():
                result = score_manifest(self, variables, manifest, config.eval.batch_size)
                scores.update({f"{split}_{k}": v for k, v in result.items()})
        text = result_text({**summary, **scores}, self.data.describe())
        for split in extra:
            if f"{split}_cer" in scores:
                text += (f"; {EXTRA_TESTS[split]}: CER {100 * scores[f'{split}_cer']:.2f}% "
                         f"WER {100 * scores[f'{split}_wer']:.2f}% (greedy)")
        return scores, text

    # -- scripts/evaluate.py's options and scoring (the engine's optional hooks, jaxring/engine/task.py)

    add_evaluate_arguments = staticmethod(evaluation.add_evaluate_arguments)

    def evaluate(self, args, config, variables) -> tuple[dict, str | None]:
        return evaluation.evaluate(self, args, config, variables)

    # -- inference on audio files

    def audio_features(self, path: str) -> np.ndarray:
        """The model's input for an audio file (any sample rate); DataError naming it and why it is unusable."""
        try:
            samples, _ = read_audio(path)
        except FileNotFoundError:
            raise DataError(f"{path}: {P.MISSING_FILE}") from None
        except AudioError as e:
            raise DataError(f"{path}: {P.UNREADABLE_AUDIO} ({e})") from None
        if not np.isfinite(samples).all():
            raise DataError(f"{path}: {P.NON_FINITE_AUDIO}")
        return featurize(samples, self.model_config.num_features)

    def audio_batch(self, paths: list[str]) -> dict:
        """A batch of the model's inputs for audio files (any sample rate); DataError for an unusable one."""
        spectrograms = [self.audio_features(path) for path in paths]
        frames = max(len(s) for s in spectrograms)
        features = np.zeros((len(paths), frames, spectrograms[0].shape[1]), np.float32)
        for i, s in enumerate(spectrograms):
            features[i, : len(s)] = s
        return {"features": features, "feature_lengths": np.array([len(s) for s in spectrograms], np.int32)}

    def transcribe(self, variables, paths: list[str]) -> list[str]:
        """Transcripts of audio files (by self.decoder), one per path."""
        outputs = jax.jit(self.predict)(variables, self.audio_batch(paths))
        return self.decoder(outputs["logits"], outputs["lengths"])
