"""Speech data for Deep Speech 2: corpora (synthetic, LibriSpeech, manifests), features, batches.

    corpus = ensure_synthetic_corpus("data/cache", utterances=8000, seed=0)
    train = SpeechDataset(read_manifest(f"{corpus}/train.jsonl"), output_frames=model_frames)
    for batch in BatchIterator(train, per_device_batch=16, local_devices=8): ...
"""

from models.deepspeech2.data.audio import AudioError, read_audio
from models.deepspeech2.data.batching import BatchIterator, epoch_batches
from models.deepspeech2.data.dataset import Example, SpeechDataset
from models.deepspeech2.data.features import featurize, log_spectrogram, num_frames
from models.deepspeech2.data.librispeech import read_librispeech, write_librispeech_manifest
from models.deepspeech2.data.manifest import Utterance, read_manifest, write_manifest
from models.deepspeech2.data.problems import DataError, Problems
from models.deepspeech2.data.synth import ensure_synthetic_corpus, generate_corpus

__all__ = [
    "AudioError", "BatchIterator", "DataError", "Example", "Problems", "SpeechDataset",
    "Utterance", "ensure_synthetic_corpus", "epoch_batches", "featurize", "generate_corpus",
    "log_spectrogram", "num_frames", "read_audio", "read_librispeech", "read_manifest",
    "write_librispeech_manifest", "write_manifest",
]
