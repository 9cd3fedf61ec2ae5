"""What the synthesizer wrappers (flite.py, festival.py) share."""

from jaxring.engine.task import DataError


class SynthesizerMissing(DataError):
    """A synthesizer that is not installed here; the message says what to install (train.py prints it as one line)."""
