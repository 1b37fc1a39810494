"""What every benchmark records about the machine it ran on, so that figures are compared like for like."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine(**extra: Any) -> dict[str, Any]:
    """CPU count, Python version and platform, plus ``extra`` (what one benchmark also depends on)."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **extra,
    }
