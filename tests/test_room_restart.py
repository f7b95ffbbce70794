"""Whole-room restart keeps the morning: stop `playground` (as `make run` starts it) and the model server, start them
again on the same run store, and a person's recent runs (same cookies) and an API run id are still there. Real
server processes, the browser's own protocol (bench/st_client.py) and the official `openai` client."""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from conftest import tiny_prompt
from engine.runs import loads
from servers import ROOT, free_port, python, tiny_args, wait_ready

sys.path.insert(0, str(ROOT / "bench"))
from st_client import Person  # noqa: E402

pytestmark = pytest.mark.serial

RUN_LINK = re.compile(r"\?run=(run-[0-9a-f]+)")


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(60)


async def generate_on_the_journey_page(person: Person) -> str:
    await person.open("journey")
    assert await person.until(lambda p: "journey.generate" in p.widgets and p.runs >= 1, 120), person.texts
    await person.press("journey.generate", **{"journey.prompt": tiny_prompt(5, seed=21), "journey.max_new": 4})
    assert await person.until(lambda p: any(t.startswith("Done:") for t in p.texts), 120), person.texts
    return RUN_LINK.search(next(t for t in person.texts if t.startswith("Done:"))).group(1)


async def what_the_person_finds(person: Person) -> tuple[list[str], list[str]]:
    """The run links on the Recordings page, and the run the journey page reopened by itself."""
    await person.open("recordings")
    assert await person.until(lambda p: p.runs >= 1, 120)
    listed = [m for t in person.texts for m in RUN_LINK.findall(t) if t.startswith("\u201c")]
    await person.open("journey")
    assert await person.until(lambda p: p.runs >= 1, 120)
    shown = [m for t in person.texts if t.startswith("Done:") for m in RUN_LINK.findall(t)]
    assert person.exceptions == []
    await person.close()
    return listed, shown


@pytest.mark.slow
def test_stopping_and_starting_the_room_again_keeps_the_morning(tiny_model_dir, tmp_path):
    env = {**os.environ, "PLAYGROUND_RUNS_DIR": str(tmp_path / "runs"), "PLAYGROUND_MODEL": str(tiny_model_dir),
           "PLAYGROUND_DEVICE": "cpu", "PLAYGROUND_DTYPE": "float32", "OMP_NUM_THREADS": "1"}
    web, api = free_port(), free_port()
    app_cmd = [python(), "-m", "app.launch", "--port", str(web)]
    api_cmd = [python(), "-m", "engine", "serve", "--port", str(api), *tiny_args(tiny_model_dir)]
    web_url, api_url = f"http://127.0.0.1:{web}", f"http://127.0.0.1:{api}"
    procs = [start(app_cmd, env, tmp_path / "app.log"), start(api_cmd, env, tmp_path / "api.log")]
    try:
        wait_ready(api_url, procs[1], tmp_path / "api.log")
        wait_ready(web_url, procs[0], tmp_path / "app.log", path="/_stcore/health")
        person = Person(web_url)
        page_run = asyncio.run(generate_on_the_journey_page(person))
        client = openai.OpenAI(base_url=api_url + "/v1", api_key="unused")
        reply = client.completions.create(model=client.models.list().data[0].id, prompt=tiny_prompt(6, seed=22),
                                          max_tokens=4, temperature=0)
        stop(*procs)                                                      # the whole room goes down
        procs = [start(app_cmd, env, tmp_path / "app.log"), start(api_cmd, env, tmp_path / "api.log")]
        wait_ready(api_url, procs[1], tmp_path / "api.log")
        wait_ready(web_url, procs[0], tmp_path / "app.log", path="/_stcore/health")
        listed, shown = asyncio.run(what_the_person_finds(Person(web_url, cookies=person.cookies)))
        assert listed == [page_run] and shown == [page_run]               # the person's morning, reopened
        run = httpx.get(f"{api_url}/v1/playground/runs/{reply.id}/file", timeout=30)
        assert run.status_code == 200 and loads(run.content).token_texts[-1] in reply.choices[0].text
        part = httpx.get(f"{api_url}/v1/playground/runs/{reply.id}", headers={"Accept": "application/json"})
        assert part.status_code == 200
    finally:
        stop(*procs)
