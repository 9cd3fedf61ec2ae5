"""The default corpus: English synthesised by eSpeak NG, with held-out voices for dev and test.

Every utterance is a function of (seed, index): its text, accent, voice variant, rate,
pitch, noise colour and SNR come from a generator seeded with both, and eSpeak is reloaded
at the start of every block of BLOCK utterances (its state carries over between
utterances), so a corpus is the same whether it is made by one process or a pool. Dev and test speak with voice variants that
training never hears, so their error rates measure generalisation to new speakers.
"""

import fcntl
import functools
import logging
import multiprocessing
import os
import shutil
import tempfile
import time

import numpy as np
import scipy.fft

from models.deepspeech2.data import audio, espeak, vocabulary
from models.deepspeech2.data.manifest import write_manifest

log = logging.getLogger(__name__)

# Bump when the generated audio or text changes, so cached corpora are regenerated.
VERSION = 1
BLOCK = 100
SPLITS = ("train", "dev", "test")
DEV_FRACTION = TEST_FRACTION = 0.1

ACCENTS = ("en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-us-nyc",
           "en-gb-x-gbclan", "en-gb-x-gbcwmd")
# eSpeak voice variants, minus effect voices (whisper, robots, croak, ...) that are hard
# to understand. Each split has its own speakers.
VARIANTS = {
    "train": (
        "f1", "f3", "f5", "m1", "m2", "m3", "m5", "m7", "m8", "Alex", "Andrea", "Denis",
        "Diogo", "Gene", "Gene2", "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario",
        "Michael", "Mike", "Nguyen", "Reed", "RicishayMax", "Storm", "adam", "anika",
        "announcer", "antonio", "aunty", "boris", "caleb", "david", "ed", "edward2",
        "grandma", "grandpa", "gustave", "ian", "iven", "iven2", "iven4", "john",
        "kaukovalta", "klatt3", "klatt6", "linda", "marcelo", "max", "michel", "miguel",
        "mike2", "pablo", "paul", "pedro", "rob", "robert", "sandro", "shelby", "steph",
        "steph3", "travis", "victor", "zac",
    ),
    "dev": ("f2", "m4", "belinda", "benjamin", "Andy", "klatt5", "steph2", "norbert"),
    "test": ("f4", "m6", "Annie", "edward", "iven3", "klatt4", "Alicia", "quincy"),
}
RATE_WPM = (120, 185)
PITCH = (25, 75)
PITCH_RANGE = (30, 80)
SNR_DB = (15.0, 35.0)
LEAD_SILENCE_S = (0.05, 0.3)


def split_sizes(utterances: int) -> dict[str, int]:
    """How many of the utterances go to each split (dev and test get at least one each)."""
    if utterances < 3:
        raise ValueError(f"a corpus needs at least 3 utterances (one per split), got {utterances}")
    dev = max(1, round(utterances * DEV_FRACTION))
    test = max(1, round(utterances * TEST_FRACTION))
    return {"train": utterances - dev - test, "dev": dev, "test": test}


def split_of(index: int, sizes: dict[str, int]) -> str:
    """The split of utterance `index`: the splits take consecutive indices, in the order of `sizes`."""
    for split, size in sizes.items():
        if index < size:
            return split
        index -= size
    raise IndexError(index)


def noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """White or pink (1/f power) noise of unit RMS."""
    pink = rng.random() < 0.5
    # Shaped at a length the FFT handles fast, then cut: n itself may be a large prime.
    white = rng.standard_normal(scipy.fft.next_fast_len(n, real=True) if pink else n)
    if pink:
        spectrum = scipy.fft.rfft(white)
        spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
        spectrum[0] = 0
        white = scipy.fft.irfft(spectrum, len(white))
    white = white[:n]
    return white / (np.sqrt(np.mean(white**2)) + 1e-12)


def make_utterance(seed: int, index: int, split: str) -> tuple[np.ndarray, dict]:
    """16 kHz float32 samples and the manifest fields (without the path) of one utterance.

    The fields depend on (seed, index) only; the audio also on what eSpeak synthesised since
    its last reset (espeak.reset()).
    """
    rng = np.random.default_rng([seed, index])
    text = vocabulary.sample_text(rng)
    voice = f"{rng.choice(ACCENTS)}+{rng.choice(VARIANTS[split])}"
    rate = int(rng.integers(*RATE_WPM, endpoint=True))
    pitch = int(rng.integers(*PITCH, endpoint=True))
    pitch_range = int(rng.integers(*PITCH_RANGE, endpoint=True))
    snr_db = float(rng.uniform(*SNR_DB))
    speech, rate_hz = espeak.synthesize(text, voice, rate, pitch, pitch_range)
    speech = audio.resample(speech, rate_hz)
    lead = int(rng.uniform(*LEAD_SILENCE_S) * audio.SAMPLE_RATE)
    speech = np.concatenate([np.zeros(lead, np.float32), speech])
    speech_rms = np.sqrt(np.mean(speech**2))
    signal = speech + noise(rng, len(speech)) * speech_rms * 10 ** (-snr_db / 20)
    signal *= rng.uniform(0.3, 0.9) / np.max(np.abs(signal))
    fields = {"duration": len(signal) / audio.SAMPLE_RATE, "text": text,
              "voice": voice, "rate_wpm": rate, "pitch": pitch, "snr_db": round(snr_db, 1)}
    return signal.astype(np.float32), fields


def _write_block(seed: int, out_dir: str, sizes: dict[str, int], start: int) -> list[dict]:
    espeak.reset()
    entries = []
    for index in range(start, min(start + BLOCK, sum(sizes.values()))):
        split = split_of(index, sizes)
        samples, fields = make_utterance(seed, index, split)
        entries.append(write_utterance(out_dir, split, index, samples, fields))
    return entries


def write_utterance(out_dir: str, split: str, index: int, samples: np.ndarray, fields: dict) -> dict:
    """Writes OUT_DIR/audio/SPLIT/INDEX.flac; its manifest entry, with its split."""
    import soundfile  # here, not at the top: the training step builds without it (scripts/gpu/gpu_check.sh's image)

    path = os.path.join(out_dir, "audio", split, f"{index:07d}.flac")
    soundfile.write(path, samples, audio.SAMPLE_RATE, subtype="PCM_16")
    return {"audio_filepath": path, **fields, "split": split}


def write_corpus(out_dir: str, sizes: dict[str, int], write_block, workers: int | None = None) -> None:
    """Writes a corpus of sizes[split] utterances per split into out_dir: audio/<split>/*.flac and <split>.jsonl.

    write_block(out_dir, sizes, start): the entries of utterances start .. start + BLOCK - 1
    (write_utterance's), a picklable function of its arguments alone, so the corpus does not
    depend on `workers`: processes to use (default: one per ~500 utterances, at most one per core).
    """
    utterances = sum(sizes.values())
    for split in sizes:
        os.makedirs(os.path.join(out_dir, "audio", split), exist_ok=True)
    if workers is None:
        workers = min(os.cpu_count() or 1, -(-utterances // 500))
    write = functools.partial(write_block, out_dir, sizes)
    starts = range(0, utterances, BLOCK)
    if workers <= 1:
        blocks = [write(start) for start in starts]
    else:
        # spawn, not fork: the caller may already run JAX threads, which fork would corrupt.
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            blocks = pool.map(write, starts, chunksize=1)
    entries = [entry for block in blocks for entry in block]
    for split in sizes:
        rows = [{k: v for k, v in e.items() if k != "split"} for e in entries if e["split"] == split]
        write_manifest(os.path.join(out_dir, f"{split}.jsonl"), rows)


def corpus_folder(cache_dir: str, utterances: int, seed: int) -> str:
    """Where ensure_synthetic_corpus keeps the corpus of (utterances, seed) under `cache_dir`."""
    return os.path.join(cache_dir, f"espeak-v{VERSION}-n{utterances}-seed{seed}")


def generate_corpus(out_dir: str, utterances: int, seed: int, workers: int | None = None) -> None:
    """Synthesises the corpus into out_dir: audio/<split>/*.flac and {train,dev,test}.jsonl.

    workers: processes to use (default: one per ~500 utterances, at most one per core).
    The result does not depend on it.
    """
    write_corpus(out_dir, split_sizes(utterances), functools.partial(_write_block, seed), workers)


def cached_corpus(cache_dir: str, name: str, utterances: int, generate) -> str:
    """CACHE_DIR/NAME, made by generate(folder) on first use.

    Generation goes to a temporary folder renamed into place when complete, so an
    interrupted run is never reused; a file lock lets concurrent processes (MPI ranks)
    wait for one generator instead of racing. The folder is absolute: the generator writes
    the manifests' paths relative to the manifests' folder from where the audio lies.
    """
    cache_dir = os.path.abspath(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, name)
    with open(os.path.join(cache_dir, name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(final):
            log.info("synthesising %d utterances into %s (once per corpus)", utterances, final)
            started = time.monotonic()
            partial = tempfile.mkdtemp(prefix=name + ".partial-", dir=cache_dir)
            try:
                generate(partial)
                os.rename(partial, final)
                log.info("synthesised %d utterances in %.0f s", utterances, time.monotonic() - started)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
    return final


def ensure_synthetic_corpus(cache_dir: str, utterances: int, seed: int,
                            workers: int | None = None) -> str:
    """The folder of the synthetic corpus for (utterances, seed), generated on first use (cached_corpus)."""
    generate = functools.partial(generate_corpus, utterances=utterances, seed=seed, workers=workers)
    return cached_corpus(cache_dir, os.path.basename(corpus_folder(cache_dir, utterances, seed)), utterances, generate)
