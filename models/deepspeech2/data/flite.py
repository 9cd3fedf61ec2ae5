"""CMU Flite text-to-speech through ctypes, from the Debian package `flite` (libflite1 and its voices).

Flite's US English voices are built from recordings of real speakers: kal16 by diphone
concatenation, awb (Scottish English, male), rms (US, male) and slt (US, female) by
statistical parametric synthesis (clustergen) from the CMU ARCTIC recordings. Each voice
lives in its own shared library and is loaded once per process. Nothing is downloaded:
without the package, `available()` is False and synthesis raises SynthesizerMissing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from models.deepspeech2.data.synthesizers import SynthesizerMissing

VOICES = ("kal16", "awb", "rms", "slt")
_STRETCH = b"duration_stretch"
_F0 = (b"int_f0_target_mean", b"int_f0_target_stddev")  # kal16's intonation targets, Hz (clustergen voices have none)
DIPHONE_VOICES = ("kal16",)
INSTALL = "install Debian's flite package (as root: apt-get install flite; `make train-voices` does it)"


class _Wave(ctypes.Structure):  # cst_wave of flite 2.x (cst_wave.h)
    _fields_ = [("type", ctypes.c_char_p), ("sample_rate", ctypes.c_int), ("num_samples", ctypes.c_int),
                ("num_channels", ctypes.c_int), ("samples", ctypes.POINTER(ctypes.c_short))]


class _Voice(ctypes.Structure):  # the head of cst_voice (cst_voice.h): its name and its feature set
    _fields_ = [("name", ctypes.c_char_p), ("features", ctypes.c_void_p)]


def _library(name: str) -> ctypes.CDLL:
    path = ctypes.util.find_library(name)
    if path is None:
        raise SynthesizerMissing(f"flite: no shared library {name}; {INSTALL}")
    # RTLD_GLOBAL: the voice libraries resolve the language and lexicon libraries' symbols through it.
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


@functools.cache
def _flite() -> ctypes.CDLL:
    lib = _library("flite")
    for name in ("flite_usenglish", "flite_cmulex"):
        _library(name)
    lib.flite_init()
    lib.flite_text_to_wave.restype = ctypes.POINTER(_Wave)
    lib.flite_text_to_wave.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Voice)]
    lib.flite_feat_set_float.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_float]
    lib.flite_get_param_float.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_float]
    lib.flite_get_param_float.restype = ctypes.c_float
    lib.delete_wave.argtypes = [ctypes.POINTER(_Wave)]
    return lib


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)


@functools.cache
def _voice(name: str) -> tuple:
    """(the registered voice, its own duration stretch: kal16's is 1.1, its own (f0 mean, f0 stddev) in Hz)."""
    if name not in VOICES:
        raise ValueError(f"flite has no voice {name!r} here; voices: {', '.join(VOICES)}")
    _flite()
    library = _library(f"flite_cmu_us_{name}")
    register = getattr(library, f"register_cmu_us_{name}")
    register.restype = ctypes.POINTER(_Voice)
    register.argtypes = [ctypes.c_char_p]
    handle = register(None)
    features = handle.contents.features
    get = _flite().flite_get_param_float
    return handle, get(features, _STRETCH, 1.0), tuple(get(features, key, 0.0) for key in _F0)


def available() -> bool:
    """Whether flite and all of VOICES can be loaded."""
    try:
        for name in VOICES:
            _voice(name)
    except SynthesizerMissing:
        return False
    return True


def synthesize(text: str, voice: str, duration_stretch: float = 1.0,
               pitch_hz: tuple[float, float] | None = None) -> tuple[np.ndarray, int]:
    """Speech for `text` as float32 samples in [-1, 1) and its sample rate (16000 Hz for these voices).

    duration_stretch: above 1 speaks slower than the voice does by itself.
    pitch_hz: (mean, standard deviation) of the intonation's f0 targets, for DIPHONE_VOICES only; None: the
    voice's own. (The clustergen voices keep their pitch in their models, not in a setting.)
    """
    lib, (handle, own_stretch, own_pitch) = _flite(), _voice(voice)
    if pitch_hz is not None and voice not in DIPHONE_VOICES:
        raise ValueError(f"flite voice {voice} has no pitch setting; only {', '.join(DIPHONE_VOICES)} do")
    # A voice's settings persist between calls: set every time.
    features = handle.contents.features
    lib.flite_feat_set_float(features, _STRETCH, own_stretch * duration_stretch)
    if voice in DIPHONE_VOICES:
        for key, value in zip(_F0, pitch_hz or own_pitch):
            lib.flite_feat_set_float(features, key, value)
    # The clustergen voices' excitation draws from the C library's rand(): seeded as a fresh
    # `flite` process has it, each utterance is reproducible and equals the command's output.
    _libc().srand(1)
    wave = lib.flite_text_to_wave(text.encode(), handle)
    try:
        w = wave.contents
        if w.num_channels != 1:
            raise RuntimeError(f"flite voice {voice} gave {w.num_channels} channels; expected mono")
        samples = np.ctypeslib.as_array(w.samples, shape=(w.num_samples,)).astype(np.float32) / 32768.0
        return samples, w.sample_rate
    finally:
        lib.delete_wave(wave)
