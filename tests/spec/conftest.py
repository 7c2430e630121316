"""A fixture that writes sweep files from YAML text."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

MINIMAL = """\
name: t
algorithm: {algorithm}
objective: {{metric: val-core/arith/acc/mean@1, mode: max}}
"""


@pytest.fixture
def sweep_file(tmp_path: Path):
    """``sweep_file(text, algorithm="grpo")`` → path of a sweep file: the minimal header plus ``text``."""

    def write(text: str = "", algorithm: str = "grpo", name: str = "sweep.yaml", header: bool = True) -> Path:
        path = tmp_path / name
        body = textwrap.dedent(text)
        path.write_text((MINIMAL.format(algorithm=algorithm) if header else "") + body)
        return path

    return write
