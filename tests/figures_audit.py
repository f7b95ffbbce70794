"""Which measured-looking figures of README.md and docs/*.md no entry of tests/test_figures.py checks: every number
with a unit of time, speed, size, a ratio (x) or a share (%), outside the text an entry finds in its file and outside
the phrases README_NOT_MEASURED and DOCS_NOT_MEASURED list. The suite fails while this lists anything
(`test_every_figure_in_a_document_is_checked_or_not_a_measurement`); this prints each one with its context.

    python tests/figures_audit.py                 # every document, each candidate with its context
    python tests/figures_audit.py README.md --count

A candidate is not necessarily a measurement: a config value, a spec sheet's figure or a target is one too. Each
measured figure gets an entry in tests/test_figures.py (its results file, the key), or, with no file that holds it, is
measured again through bench/provenance.py or worded without the figure; anything else is listed as not measured."""
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
