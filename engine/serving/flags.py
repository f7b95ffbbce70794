"""The serving limits as command-line flags, for both launchers (`playground`, `python -m engine serve`).
Torch-free, so that `--help` answers at once; the limits themselves are engine/serving/limits.py's."""
from __future__ import annotations

from typing import Any

# (Limits field, type, help) for a launcher: the flag is --field-with-dashes, the variable is ENV_VARS[field].
LIMIT_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("max_prompt_tokens", int, "longest prompt in tokens, chat template included"),
    ("max_new_tokens", int, "most tokens one request may generate"),
    ("max_queue", int, "requests that may wait for a place in the batch (0: none wait)"),
    ("max_batch", int, "requests decoded together in one forward pass (1: one at a time)"),
    ("prefix_cache_mb", int, "memory for prompt K/V reused by later prompts that start alike, in MiB (0: off)"),
    ("max_sessions", int, "browser sessions served at once"),
    ("max_capture_mb", int, "attention capture one request may hold, in MiB"),
    ("max_capture_layers", int, "layers one request may capture"),
    ("request_seconds", float, "wall time of one request before it is stopped"),
    ("reserve_mb", int, "memory kept free for everything else, in MiB"),
    ("max_saved_per_session", int, "recordings one person (a browser) may keep on the server's disk (0: none)"),
    ("max_saved_mb", int, "recordings kept on disk for all sessions together, in MiB; the oldest go first"),
)




def add_limit_flags(parser: Any) -> None:
    """The limits as command-line flags (argparse), in a group of their own."""
    group = parser.add_argument_group("limits (also PLAYGROUND_MAX_... environment variables)")
    for name, kind, text in LIMIT_FLAGS:
        group.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
