"""Numbers as the console shows them: four significant digits for floats, integers and text as they are."""

from __future__ import annotations

import math
from typing import Any


def short(value: Any) -> str:
    """``0.711328125`` → ``"0.7113"``, ``nan`` → ``"nan"``, ``80`` → ``"80"``, None → ``""``."""
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return "" if value is None else str(value)
