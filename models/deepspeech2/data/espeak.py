"""eSpeak NG text-to-speech through ctypes, from the library the `espeakng-loader` wheel ships.

eSpeak keeps global state (one voice, one callback per process), so the synthesiser is a
process-wide singleton; parallel generation uses a process pool, one engine per worker.
Some of that state outlives an utterance (the phase of its pitch flutter, for one), so the
same call gives slightly different audio depending on what was synthesised before; reset()
reloads the library to make output reproducible.
"""

import _ctypes
import ctypes
import functools
import threading

import numpy as np

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_END_PAUSE = 0x1000
_EE_OK = 0
_RATE, _PITCH, _RANGE = 1, 3, 4

_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class EspeakError(RuntimeError):
    pass


class _Engine:
    def __init__(self):
        import espeakng_loader  # here, not at the top: the training step builds without it (scripts/gpu/gpu_check.sh's image)

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        self.sample_rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0
        )
        if self.sample_rate <= 0:
            raise EspeakError(
                f"espeak_Initialize failed (returned {self.sample_rate}); "
                "reinstall the espeakng-loader wheel"
            )
        self._lib = lib
        self._libc = ctypes.CDLL(None)
        self._chunks: list[np.ndarray] = []
        # Kept on self: ctypes would free the trampoline while eSpeak still points at it.
        self._callback = _SYNTH_CALLBACK(self._collect)
        lib.espeak_SetSynthCallback(self._callback)
        self._lock = threading.Lock()

    def _collect(self, wav, num_samples, events):
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0

    def synthesize(self, text: str, voice: str, rate: int, pitch: int, pitch_range: int) -> np.ndarray:
        with self._lock:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
                raise EspeakError(f"eSpeak has no voice {voice!r}; see espeak-ng-data/voices")
            for parameter, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range)):
                self._lib.espeak_SetParameter(parameter, value, 0)
            # Breath noise comes from a generator that eSpeak seeds from the clock, and
            # possibly from the C library's process-wide rand(): fix both seeds.
            self._lib.espeak_ng_SetRandSeed(0)
            self._libc.srand(0)
            data = text.encode() + b"\0"
            self._chunks = []
            status = self._lib.espeak_Synth(
                data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _END_PAUSE, None, None
            )
            if status != _EE_OK:
                raise EspeakError(f"espeak_Synth failed with status {status} on {text!r}")
            samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        return samples.astype(np.float32) / 32768.0


@functools.cache
def engine() -> _Engine:
    """The process's eSpeak engine (initialised on first use)."""
    return _Engine()


def reset() -> None:
    """Unloads libespeak-ng so that the next synthesis starts from freshly loaded state.

    Needs the only handle on the library to be ours (nothing else in the process loaded it),
    otherwise the unload is a no-op and the state carries on.
    """
    if engine.cache_info().currsize:
        _ctypes.dlclose(engine()._lib._handle)
        engine.cache_clear()


def synthesize(text: str, voice: str = "en-us", rate: int = 175, pitch: int = 50,
               pitch_range: int = 50) -> tuple[np.ndarray, int]:
    """Speech for `text` as float32 samples in [-1, 1) and its sample rate (22050 Hz).

    voice: an eSpeak voice name, optionally with a variant ("en-us+f3").
    rate: words per minute (80-450); pitch and pitch_range: 0-100.
    """
    synth = engine()
    return synth.synthesize(text, voice, rate, pitch, pitch_range), synth.sample_rate
