"""docs/known_faults.md names the tests that hold each fault: every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_the_known_faults_page_names_exists():
    page = (ROOT / "docs" / "known_faults.md").read_text()
    refs = re.findall(r"`((?:tests|parity_tests)/[\w/]+\.py)(?:::(\w+))?`", page)
    assert len(refs) >= 20
    for path, name in refs:
        source = (ROOT / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"{path}::{name}"
