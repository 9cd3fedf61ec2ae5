"""The Festival speech synthesis system, from Debian's `festival` and its festvox voice packages.

The voices used here are diphone voices: concatenated recordings of two real American
English speakers (kal and ked, packages festvox-kallpc16k and festvox-kdlpc16k). Festival
starts in a fraction of a second, so a whole batch of utterances goes through one
`festival -b` process. Nothing is downloaded: without the packages, `available()` is False
and synthesis raises SynthesizerMissing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np

from models.deepspeech2.data.synthesizers import SynthesizerMissing

VOICES = ("kal_diphone", "ked_diphone")
VOICE_DIR = "/usr/share/festival/voices/english"
INSTALL = ("install Debian's festival, festvox-kallpc16k and festvox-kdlpc16k "
           "(as root: apt-get install festival festvox-kallpc16k festvox-kdlpc16k; `make train-voices` does it)")


def missing() -> list[str]:
    """What of festival and VOICES is not installed here (empty: all is)."""
    absent = [] if shutil.which("festival") else ["festival"]
    return absent + [v for v in VOICES if not os.path.isdir(os.path.join(VOICE_DIR, v))]


def available() -> bool:
    return not missing()


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def synthesize_many(requests: list[tuple]) -> list[tuple[np.ndarray, int]]:
    """(float32 samples in [-1, 1), sample rate) for each (text, voice, duration stretch[, pitch]) in one festival run.

    duration stretch: above 1 speaks slower than the voice does by itself. pitch: (mean, standard
    deviation) in Hz of the intonation model's f0 targets (the voices' own: 105, 14-15); absent or None: the voice's own.
    """
    if not requests:
        return []
    absent = missing()
    if absent:
        raise SynthesizerMissing(f"festival: {', '.join(absent)} not installed; {INSTALL}")
    with tempfile.TemporaryDirectory(prefix="festival-") as folder:
        lines = ["(Parameter.set 'Audio_Method 'none)"]
        for i, (text, voice, stretch, *pitch) in enumerate(requests):
            if voice not in VOICES:
                raise ValueError(f"festival has no voice {voice!r} here; voices: {', '.join(VOICES)}")
            path = _scheme_string(os.path.join(folder, f"{i}.wav"))
            # Selecting a voice sets its own stretch (1.1 for these): scaled from there.
            lines += [f"(voice_{voice})", f"(Parameter.set 'Duration_Stretch (* {stretch:.4f} (Parameter.get 'Duration_Stretch)))"]
            if pitch and pitch[0] is not None:
                # Selecting a voice resets its intonation parameters, so this holds for this utterance only.
                mean, std = pitch[0]
                lines.append(f"(set! int_lr_params (list (list 'target_f0_mean {mean:.1f}) (list 'target_f0_std {std:.1f}) "
                             "(list 'model_f0_mean 170) (list 'model_f0_std 34)))")
            lines.append(f"(utt.save.wave (SynthText {_scheme_string(text)}) {path} 'riff)")
        script = os.path.join(folder, "batch.scm")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        done = subprocess.run(["festival", "-b", script], capture_output=True, text=True)
        outputs = []
        for i in range(len(requests)):
            path = os.path.join(folder, f"{i}.wav")
            if done.returncode != 0 or not os.path.isfile(path):
                raise RuntimeError(f"festival failed on {requests[i]!r} (exit {done.returncode}): {done.stderr[-500:]}")
            import soundfile  # here, not at the top: the training step builds without it (scripts/gpu/gpu_check.sh's image)

            samples, rate = soundfile.read(path, dtype="float32")
            outputs.append((samples, rate))
    return outputs
