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
