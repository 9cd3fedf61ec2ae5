"""Shared by the fault tests: one tiny synthetic corpus for the session."""

import pytest

from models.deepspeech2.data import ensure_synthetic_corpus


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory):
    """data.cache_dir holding the corpus tiny_runs.tiny_overrides asks for (30 utterances, seed 0)."""
    cache = tmp_path_factory.mktemp("faults_cache")
    ensure_synthetic_corpus(str(cache), 30, 0)
    return cache
