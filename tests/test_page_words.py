"""Words the pages build from data read as sentences: a job's progress line from its own name, a listed prompt on one
line, and the precision table saying why a copy shows no error (issue 55 item 11)."""
from __future__ import annotations

import pytest

from app.runs.live import _turn_message
from app.runs.recordings import one_line
from app.speed.precision import origin_note
from engine.service.jobs import JOBS
from engine.serving.scheduler import QueueStatus


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_jobs_waiting_lines_read_as_sentences(name):
    what = JOBS[name].what
    running = _turn_message(QueueStatus("running", 0, 0, None, 0.0), what)
    queued = _turn_message(QueueStatus("queued", 2, 1, None, 3.0, running=2), what)
    assert running == what[0].upper() + what[1:] + ": running on the model…"
    assert queued.startswith(what[0].upper() + what[1:] + " needs the model to itself")
    assert "Measuring the" not in running and "measurement measurement" not in running


def test_capitals_inside_a_jobs_name_stay():
    assert "GPTQ/AWQ" in _turn_message(QueueStatus("running", 0, 0, None, 0.0), JOBS["quant.methods"].what)
    assert "Q, K, V" in _turn_message(QueueStatus("queued", 1, 0, None, 0.0), JOBS["run.norms"].what)


def test_a_listed_prompt_shows_on_one_line_as_text():
    prompt = "Summarise this:\n\nThe quick brown fox\tjumps.\n"
    assert one_line(prompt, 80) == "Summarise this: The quick brown fox jumps."
    assert "\\n" not in one_line(prompt, 80) and "\n" not in one_line(prompt, 80)
    cut = one_line("word " * 40, 20)
    assert len(cut) == 20 and cut.endswith("…")


def row(name: str, error: float, ppl_change: float | None) -> dict:
    return {"precision": name, "weight_error": error, "ppl": None if ppl_change is None else 10 * (1 + ppl_change),
            "ppl_change": ppl_change or 0.0, "compute": "bf16"}


def test_a_copy_on_the_weights_own_grid_says_why_in_the_headline():
    rows = [row("FLOAT32", 0.0, None), row("INT8", 0.004, 0.001), row("INT4 (g32)", 0.00001, -0.002)]
    note = origin_note(rows, from_4bit_file=True)
    assert note.startswith("INT4 (g32): weight error 0.00%, because round-to-nearest found the grid")
    assert "converted from a 4-bit GGUF file" in note and "perplexity change (-0.2%)" in note
    assert "comes out ahead of INT8 (+0.1%)" in note and "BF16" in note
    behind = [row("FLOAT32", 0.0, None), row("INT8", 0.004, -0.003), row("INT4 (g32)", 0.00001, -0.002)]
    assert "ahead of" not in origin_note(behind, from_4bit_file=False)            # said only when it is so
    assert "GGUF" not in origin_note(behind, from_4bit_file=False)
    assert origin_note([row("FLOAT32", 0.0, None), row("INT8", 0.004, 0.001)], True) is None
