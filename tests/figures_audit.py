"""Which measured-looking figures of README.md and docs/*.md no entry of tests/test_figures.py checks: every number
with a unit of time, speed, size, a ratio (x) or a share (%), outside the text an entry finds in its file.

    python tests/figures_audit.py                 # every document, each candidate with its context
    python tests/figures_audit.py README.md --count

A candidate is not necessarily a measurement: a config value, a spec sheet's figure or a target is one too. This is
the list to go through by hand (issue 49): each measured figure gets an entry in tests/test_figures.py, or is removed,
or is worded as what it is."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_figures as tf  # noqa: E402


def main(argv: list[str]) -> int:
    count = "--count" in argv
    names = [a for a in argv if not a.startswith("--")] or list(tf.DOCS)
    total = 0
    for name in names:
        found = tf.unchecked(name)
        total += len(found)
        print(f"{name}: {len(found)} unchecked")
        for context in ([] if count else found):
            print(f"  ...{context}...")
    print(f"in all: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
