"""The installed library stands alone: jaxring and its engine import without models/ or the speech extra."""

import subprocess
import sys

SPEECH_EXTRA = ("jiwer", "soundfile", "soxr", "scipy", "espeakng_loader", "tensorboardX", "matplotlib")

_IMPORT_WITHOUT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("not installed: " + name)
sys.meta_path.insert(0, Block())
import jaxring, jaxring.engine.trainer, jaxring.engine.sync, jaxring.engine.metrics
print(jaxring.allreduce.__name__, jaxring.tree_allreduce.__name__, jaxring.init.__name__)
"""


def test_library_imports_without_the_speech_extra_or_models():
    code = _IMPORT_WITHOUT.format(blocked=(*SPEECH_EXTRA, "models"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["allreduce", "tree_allreduce", "init"]
