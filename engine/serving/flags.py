"""The serving limits as command-line flags, for both launchers (`playground`, `python -m engine serve`).
Torch-free, so that `--help` answers at once; each limit's name, type and help are its setting's
(engine/settings.py), the limits themselves engine/serving/limits.py's."""
from __future__ import annotations

from engine.settings import SPECS

# (Limits field, type, help) for a launcher: the flag is --field-with-dashes, the variable is ENV_VARS[field].
LIMIT_FLAGS: tuple[tuple[str, type, str], ...] = tuple((spec.name, spec.kind, spec.text) for spec in SPECS
                                                       if spec.group == "limits")
