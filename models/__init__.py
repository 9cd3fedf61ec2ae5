"""The checkout's tasks, registered with the engine's task registry (jaxring/engine/registry.py).

A task of your own needs no line here: name it in its config by import path
(`task: mypkg.task:MyTask`) or by an entry point (docs/YOUR_MODEL.md).
"""

from jaxring.engine import registry

registry.register("deepspeech2", "models.deepspeech2.task:DeepSpeech2Task")
