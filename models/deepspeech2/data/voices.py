"""A corpus of several synthesizers, with a synthesizer family for dev and test that training never hears.

    train        eSpeak NG (formant synthesis, its training voice variants), Festival's
                 diphone voices kal and ked (concatenated recordings of two real speakers)
                 and Flite's diphone voice kal16 (Flite's own text analysis, which dev and
                 test share, over kal's diphones); the diphone voices at a pitch and a
                 vocal-tract length drawn per utterance, so that two real speakers sound as many;
                 and SVOX Pico's two voices (hidden-Markov-model synthesis from the recordings of
                 a US and a British female speaker), at drawn pitches and vocal-tract lengths too
    dev          Flite's clustergen voice awb (statistical parametric synthesis from the
                 recordings of a Scottish male speaker)
    test         Flite's clustergen voices rms (US male) and slt (US female)
    test_espeak  eSpeak NG with the voice variants the eSpeak corpus holds out for test
                 (models/deepspeech2/data/synth.py), to compare with that corpus

No speaker of dev or test is heard in training, nor their synthesizer (Flite's clustergen): Pico,
the one other parametric synthesizer, is another system built from other speakers. Every
utterance, in every split, then goes through what a recording does to speech
(models/deepspeech2/data/acoustics.py): a speed change (tempo, pitch and formants
together), a simulated room for some, noise of a colour at a signal-to-noise ratio.
As in synth.py, every utterance is a function of (seed, index) and eSpeak and Pico are
reloaded at the start of every block, so the corpus does not depend on how many processes made it.
Needs Debian's flite, festival, festvox-kallpc16k and festvox-kdlpc16k (`make train-voices`
installs them) and PyPI's ttspico (the speech extra); without them synthesis stops with
SynthesizerMissing saying so.
"""

from __future__ import annotations

import functools

import numpy as np

from models.deepspeech2.data import acoustics, audio, espeak, festival, flite, pico, synth, vocabulary
from models.deepspeech2.data.synthesizers import SynthesizerMissing

VERSION = 3  # bump when the generated audio or text changes, so cached corpora are regenerated
SPLITS = ("train", "dev", "test", "test_espeak")
HELD_OUT_FRACTION = 0.1  # of the corpus, for each of dev, test and test_espeak
TRAIN_SHARES = {"espeak": 1 / 4, "festival": 1 / 4, "flite": 1 / 4, "pico": 1 / 4}  # of the training utterances
FLITE_VOICES = {"train": flite.DIPHONE_VOICES, "dev": ("awb",), "test": ("rms", "slt")}
PITCH_HZ = (80.0, 230.0)  # diphone training voices: mean f0 target, from low male to female (theirs: 105)
PITCH_STD_HZ = (8.0, 40.0)  # and its spread (theirs: 14-15)
# Diphone training voices: a speed change of up to 1.3 (formants and pitch up to 30% higher, as a
# shorter vocal tract has), spoken that much slower first so the tempo stays within DURATION_STRETCH / SPEED.
VOCAL_TRACT_SPEED = (0.92, 1.3)
# Pico's two voices are female: its pitch level and vocal-tract length drawn down to a male's as well.
PICO_PITCH_PERCENT = (55, 130)
PICO_VOCAL_TRACT_SPEED = (0.8, 1.1)
ESPEAK_VARIANTS = {"train": synth.VARIANTS["train"], "test_espeak": synth.VARIANTS["test"]}
DURATION_STRETCH = (0.8, 1.25)  # festival, flite and pico: slower or faster than the voice's own rate
SPEED = (0.88, 1.12)  # resampling after synthesis (acoustics.change_speed)
ROOM_SHARE = 0.5  # of utterances heard in a simulated room
RT60_S = (0.15, 0.7)
DIRECT_TO_REVERB_DB = (0.0, 12.0)
SNR_DB = (10.0, 15.0, 20.0, 30.0, 40.0)
PACKAGES = "flite festival festvox-kallpc16k festvox-kdlpc16k"  # Debian's; the Makefile's train-voices installs them
INSTALL = f"as root: apt-get install {PACKAGES} (`make train-voices` does it); ttspico: pip install ttspico (the speech extra)"


def split_sizes(utterances: int) -> dict[str, int]:
    """How many utterances each split gets (each held-out split at least one)."""
    if utterances < len(SPLITS):
        raise ValueError(f"a corpus needs at least {len(SPLITS)} utterances (one per split), got {utterances}")
    held_out = max(1, round(utterances * HELD_OUT_FRACTION))
    return {"train": utterances - 3 * held_out, "dev": held_out, "test": held_out, "test_espeak": held_out}


def missing() -> list[str]:
    """What the corpus needs that is not installed here."""
    return festival.missing() + ([] if flite.available() else ["flite"]) + ([] if pico.available() else ["ttspico"])


def plan(seed: int, index: int, split: str) -> dict:
    """The manifest fields of one utterance before synthesis: a function of (seed, index) alone."""
    rng = np.random.default_rng([seed, index])
    fields = {"text": vocabulary.sample_text(rng)}
    synthesizer = str(rng.choice(list(TRAIN_SHARES), p=list(TRAIN_SHARES.values()))) if split == "train" else None
    if split in ("dev", "test") or synthesizer == "flite":
        fields.update(synthesizer="flite", voice=str(rng.choice(FLITE_VOICES[split])))
    elif synthesizer == "festival":
        fields.update(synthesizer="festival", voice=str(rng.choice(festival.VOICES)))
    elif synthesizer == "pico":
        fields.update(synthesizer="pico", voice=str(rng.choice(pico.VOICES)))
    else:
        fields.update(synthesizer="espeak", voice=f"{rng.choice(synth.ACCENTS)}+{rng.choice(ESPEAK_VARIANTS[split])}",
                      rate_wpm=int(rng.integers(*synth.RATE_WPM, endpoint=True)),
                      pitch=int(rng.integers(*synth.PITCH, endpoint=True)),
                      pitch_range=int(rng.integers(*synth.PITCH_RANGE, endpoint=True)))
    speed = float(rng.uniform(*SPEED))
    if fields["synthesizer"] != "espeak":
        stretch = float(rng.uniform(*DURATION_STRETCH))
        if split == "train":
            vocal_tract = float(rng.uniform(*(PICO_VOCAL_TRACT_SPEED if synthesizer == "pico" else VOCAL_TRACT_SPEED)))
            stretch, speed = stretch * vocal_tract / speed, vocal_tract
            if synthesizer == "pico":
                fields["pitch_percent"] = int(rng.integers(*PICO_PITCH_PERCENT, endpoint=True))
            else:
                fields["pitch_hz"] = [round(float(rng.uniform(*PITCH_HZ)), 1), round(float(rng.uniform(*PITCH_STD_HZ)), 1)]
        if synthesizer == "pico":
            fields["rate_percent"] = round(100 / stretch)
        else:
            fields["duration_stretch"] = round(stretch, 3)
    fields["speed"] = round(speed, 3)
    if rng.random() < ROOM_SHARE:
        fields["rt60_s"] = round(float(rng.uniform(*RT60_S)), 3)
        fields["direct_to_reverb_db"] = round(float(rng.uniform(*DIRECT_TO_REVERB_DB)), 1)
    fields["noise"] = str(rng.choice(list(acoustics.NOISE_COLOURS)))
    fields["snr_db"] = float(rng.choice(SNR_DB))
    fields["lead_silence_s"] = round(float(rng.uniform(*synth.LEAD_SILENCE_S)), 3)
    return fields


def record(seed: int, index: int, speech: np.ndarray, fields: dict) -> np.ndarray:
    """16 kHz `speech` as the plan's recording hears it: speed, silence before, room, noise, level."""
    rng = np.random.default_rng([seed, index, 1])  # the room's and the noise's samples
    speech = acoustics.change_speed(speech, fields["speed"])
    speech = np.concatenate([np.zeros(int(fields["lead_silence_s"] * audio.SAMPLE_RATE), np.float32), speech])
    if "rt60_s" in fields:
        response = acoustics.room_impulse_response(rng, fields["rt60_s"], fields["direct_to_reverb_db"])
        speech = acoustics.reverberate(speech, response)
    signal = acoustics.add_noise(rng, speech, fields["snr_db"], fields["noise"])
    return (signal * (rng.uniform(0.3, 0.9) / np.max(np.abs(signal)))).astype(np.float32)


def _synthesize(fields: dict, festival_audio) -> tuple[np.ndarray, int]:
    if fields["synthesizer"] == "espeak":
        return espeak.synthesize(fields["text"], fields["voice"], fields["rate_wpm"], fields["pitch"], fields["pitch_range"])
    if fields["synthesizer"] == "flite":
        return flite.synthesize(fields["text"], fields["voice"], fields["duration_stretch"], fields.get("pitch_hz"))
    if fields["synthesizer"] == "pico":
        return pico.synthesize(fields["text"], fields["voice"], fields["rate_percent"], fields["pitch_percent"])
    return next(festival_audio)


def _write_block(seed: int, out_dir: str, sizes: dict[str, int], start: int) -> list[dict]:
    espeak.reset()
    pico.reset()
    indices = range(start, min(start + synth.BLOCK, sum(sizes.values())))
    plans = [(index, synth.split_of(index, sizes)) for index in indices]
    plans = [(index, split, plan(seed, index, split)) for index, split in plans]
    # One festival process for the block's festival utterances, in order.
    festival_audio = iter(festival.synthesize_many(
        [(f["text"], f["voice"], f["duration_stretch"], f["pitch_hz"]) for _, _, f in plans if f["synthesizer"] == "festival"]))
    entries = []
    for index, split, fields in plans:
        speech, rate = _synthesize(fields, festival_audio)
        samples = record(seed, index, audio.resample(speech, rate), fields)
        fields = {"duration": len(samples) / audio.SAMPLE_RATE, **fields}
        entries.append(synth.write_utterance(out_dir, split, index, samples, fields))
    return entries


def generate_corpus(out_dir: str, utterances: int, seed: int, workers: int | None = None) -> None:
    """Synthesises the corpus into out_dir: audio/<split>/*.flac and <split>.jsonl for SPLITS."""
    absent = missing()
    if absent:
        raise SynthesizerMissing(f"the voices corpus needs {', '.join(absent)}, not installed here; {INSTALL}")
    synth.write_corpus(out_dir, split_sizes(utterances), functools.partial(_write_block, seed), workers)


def ensure_voices_corpus(cache_dir: str, utterances: int, seed: int, workers: int | None = None) -> str:
    """The folder of the voices corpus for (utterances, seed), generated on first use (synth.cached_corpus)."""
    generate = functools.partial(generate_corpus, utterances=utterances, seed=seed, workers=workers)
    return synth.cached_corpus(cache_dir, f"voices-v{VERSION}-n{utterances}-seed{seed}", utterances, generate)
