"""The Streamlit release the room's runner fixes (app/hosting/runner_fixes.py) are written for, without importing
Streamlit: the launcher says at start, in one line, when another is installed (the fixes then stay off).

    fits("1.67.3")            # True: inside the fence
    fence_line("1.68.0")      # "Streamlit 1.68.0 is installed; ... are off: ..."; None inside the fence
"""
from __future__ import annotations

FENCE = (1, 67)                 # the minor release whose private attributes the fixes read (pyproject: ~=1.67.0)


def fits(version: str) -> bool:
    """The installed Streamlit is the minor release the fixes are written for."""
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) == FENCE


def fence_line(version: str) -> str | None:
    """What the launcher and the first page run say when `version` is outside the fence; None inside it."""
    if fits(version):
        return None
    return (f"Streamlit {version} is installed; the room's Stop and rerun fixes (app/hosting/runner_fixes.py) are "
            f"written for {FENCE[0]}.{FENCE[1]} and are off: the app runs on Streamlit's own runner")
