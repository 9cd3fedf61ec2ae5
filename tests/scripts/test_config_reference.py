"""docs/CONFIG.md is scripts/docs/config_reference.py's output: every config key, with the comment beside it in its dataclass."""

import dataclasses
import subprocess
import sys

from tests.docs.markdown import ROOT

SCRIPT = ROOT / "scripts" / "docs" / "config_reference.py"


def _script():
    sys.path.insert(0, str(SCRIPT.parent))
    import config_reference

    return config_reference


def test_the_page_is_what_the_script_writes_from_the_code():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_key_of_every_section_is_described_and_listed():
    config_reference = _script()
    assert config_reference.missing_descriptions() == []
    page = (ROOT / "docs" / "CONFIG.md").read_text()
    for _, sections in config_reference.all_sections():
        for name, cls in sections.items():
            for field in dataclasses.fields(cls):
                assert f"| `{name}.{field.name}` |" in page, f"{name}.{field.name}"


def test_comments_above_a_field_describe_it_where_none_is_beside_it():
    config_reference = _script()

    @dataclasses.dataclass
    class Section:
        beside: int = 1  # the one beside
        # two lines
        # above
        above: str = "x"

    assert config_reference.field_comments(Section) == {"beside": "the one beside", "above": "two lines above"}


def test_a_comment_beside_a_field_keeps_its_continuation_lines():
    config_reference = _script()

    @dataclasses.dataclass
    class Section:
        first: str = "a"  # begins here
        # and goes on here
        second: int = 2  # its own
        # above the third
        third: int = 3

    assert config_reference.field_comments(Section) == {
        "first": "begins here and goes on here", "second": "its own", "third": "above the third"}


def test_the_accepted_values_are_the_checks_own():
    config_reference = _script()
    from jaxring.engine import config
    from models.deepspeech2.task import DataConfig

    assert config_reference.accepted_choices(config.TrainConfig, "allreduce_dtype") == ("bfloat16", "float16", "float32")
    assert set(config_reference.accepted_choices(DataConfig, "corpus")) == {"synthetic", "voices", "manifest"}
    assert config_reference.accepted_choices(config.OptimConfig, "name")[-1] == "package.module:function"
    assert config_reference.accepted_choices(config.CheckpointConfig, "best_metric") is None  # any metric's name
    for value in config_reference.accepted_choices(config.TrainConfig, "allreduce_dtype"):
        config.TrainConfig(allreduce_dtype=value)  # each one listed is taken


def test_the_page_describes_data_corpus_whole_and_the_examples_keys():
    page = (ROOT / "docs" / "CONFIG.md").read_text()
    (corpus,) = [line for line in page.splitlines() if line.startswith("| `data.corpus` |")]
    assert '"manifest"' in corpus and "several synthesizers" in corpus and "`manifest`" in corpus
    for example in ("examples/classifier/classifier.yaml", "examples/charlm/charlm.yaml",
                    "examples/nnx_classifier/nnx_classifier.yaml"):
        assert f"## Sections of the example {example}" in page
