"""An old `.json.gz` recording made into a run file (`.run.zip`), the one format the playground writes.

    convert("france.json.gz", "france.run.zip")                   # the records and arrays as they were
    convert("france.json.gz", "france.run.zip", model="default")  # and the text of every logit-lens token

    python -m engine.runs.convert france.json.gz france.run.zip [--model default]

Every record, timing and captured array goes over unchanged (attention stays in the dtype it was saved in). An old
file stored the text of the prompt's, the answer's and the candidates' tokens; the logit lens's tokens only have
ids there, so with `--model` (the model the recording was made with; only its tokenizer is read) the run file also
carries their text and opens with every word on a machine without that model. Run files opened here are refused:
there is nothing to convert.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from engine.errors import EngineError, InvalidRequestError
from engine.runs.format import SUFFIX, dumps, load, texts_with
from engine.serving.recording import Recording


def convert(old: str | Path, out: str | Path, model: str | None = None) -> Recording:
    """Write `old` (a `.json.gz` recording) as the run file `out`; the recording it holds. InvalidRequestError (one
    line) for a name that is not a run file's, a file that is already one, or a model that did not make it."""
    old, out = Path(old), Path(out)
    if not out.name.endswith(SUFFIX):
        raise InvalidRequestError(f"a run file's name ends in {SUFFIX}, not {out.name}")
    run = load(old)
    if run.version != 0:
        raise InvalidRequestError(f"{old.name} is a run file already (version {run.version}): nothing to convert")
    recording = run.recording
    source, decode = token_texts(model, recording) if model else ("", None)
    out.write_bytes(dumps(recording, source, model or "", texts_with(recording, decode)))
    return recording


def token_texts(model: str, recording: Recording) -> tuple[str, Callable[[list[int]], str]]:
    """The folder of `model` and its tokenizer's decode, when it is the model that made `recording`."""
    from transformers import AutoTokenizer           # here: only a conversion with --model reads a tokenizer

    from engine.core.loader import read_spec, resolve  # torch and transformers: only with --model

    folder, label = resolve(model)
    spec = read_spec(folder, label)
    if (label, spec.vocab_size) != (recording.model, recording.spec.vocab_size):
        raise InvalidRequestError(f"the recording was made with {recording.model} ({recording.spec.vocab_size} "
                                  f"tokens), not {label} ({spec.vocab_size}): give --model the model that made it")
    return str(folder), AutoTokenizer.from_pretrained(folder, trust_remote_code=False).decode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.runs.convert", description=__doc__.splitlines()[0])
    parser.add_argument("old", help="a .json.gz recording (saved before run files)")
    parser.add_argument("out", help=f"the run file to write (a name ending in {SUFFIX})")
    parser.add_argument("--model", default=None, help="the model that made it ('default', a folder, a hub id): "
                        "its tokenizer gives the logit lens's tokens their text")
    args = parser.parse_args(argv)
    try:
        recording = convert(args.old, args.out, args.model)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB): {recording.title!r}, "
          f"{len(recording.records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
