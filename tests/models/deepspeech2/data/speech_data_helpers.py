"""Writers of real audio files, good and broken, for the speech data tests."""

import numpy as np
import soundfile


def write_tone(path, seconds=1.0, rate=16000, freq=440.0, channels=1, subtype=None):
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    data = np.stack([tone] * channels, axis=1) if channels > 1 else tone
    soundfile.write(str(path), data, rate, subtype=subtype)
    return tone


def write_broken_files(folder):
    """Real broken files: {name: path} for a truncated flac, random bytes and an empty file."""
    folder.mkdir(parents=True, exist_ok=True)
    good = folder / "good.flac"
    rng = np.random.default_rng(0)
    soundfile.write(str(good), rng.uniform(-0.5, 0.5, 32000).astype(np.float32), 16000)
    data = good.read_bytes()
    files = {
        "truncated": folder / "truncated.flac",
        "random": folder / "random.flac",
        "empty": folder / "empty.wav",
    }
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["random"].write_bytes(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    files["empty"].write_bytes(b"")
    return files
