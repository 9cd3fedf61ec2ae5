"""Fixtures shared by the speech data tests."""

import pytest

from models.deepspeech2.data import synth


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """A 24-utterance synthetic corpus (train 20, dev 2, test 2)."""
    out = tmp_path_factory.mktemp("corpus")
    synth.generate_corpus(str(out), 24, seed=7, workers=1)
    return out
