"""Which measured-looking figures of README.md and docs/*.md no entry of tests/test_figures.py checks: every number
with a unit of time, speed, size, a ratio (x) or a share (%), outside the text an entry finds in its file.

    python tests/figures_audit.py                 # every document, each candidate with its context
    python tests/figures_audit.py README.md --count

A candidate is not necessarily a measurement: a config value, a spec sheet's figure or a target is one too. This is
the list to go through by hand (issue 49): each measured figure gets an entry in tests/test_figures.py, or is removed,
or is worded as what it is."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_figures as tf  # noqa: E402

NUMBER = r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?"
UNIT = r"\s?(?:ms\b|s\b|tok/s|x\b|MB\b|GB/s|GB\b|MiB\b|KB\b|kB\b|KiB\b|%|TB/s|TFLOP/s|seconds?\b|minutes?\b|min\b)"
FIGURE = re.compile(NUMBER + UNIT)


def checked_spans() -> dict[str, list[tuple[int, int]]]:
    """Where in each (whitespace-squashed) document an entry's text stands."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for name, file, template, get in tf.ALL:
        text, body = tf.squash(template.format(*get(tf.result(file)))), tf.doc(name)
        at = body.find(text)
        while at >= 0:
            spans.setdefault(name, []).append((at, at + len(text)))
            at = body.find(text, at + 1)
    return spans


def unchecked(name: str, spans: list[tuple[int, int]]) -> list[tuple[str, str]]:
    body = tf.doc(name)
    return [(m.group(), body[max(0, m.start() - 90):m.end() + 40]) for m in FIGURE.finditer(body)
            if not any(a <= m.start() < b for a, b in spans)]


def main(argv: list[str]) -> int:
    count = "--count" in argv
    names = [a for a in argv if not a.startswith("--")] or list(tf.DOCS)
    spans, total = checked_spans(), 0
    for name in names:
        found = unchecked(name, spans.get(name, []))
        total += len(found)
        print(f"{name}: {len(found)} unchecked")
        for figure, context in ([] if count else found):
            print(f"  [{figure}]  ...{context}...")
    print(f"in all: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
