"""End to end: start the app the way `make run` does, drive it in headless Chromium, save screenshots.

Run with `pytest -m browser -s` to see the measured render time of the attention page on a
2,000-token prompt; timings in tests/screenshots/timings.json. Screenshots (`make screenshots`, or
PLAYGROUND_SCREENSHOTS=1) land in tests/screenshots/ (git-ignored): taken only when asked for, since nobody looks at
them in CI and the full-page ones cost the suite about a second each on 2 cores.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from servers import free_port, python
from app.launch import settings_of, streamlit_command

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "tests" / "screenshots"
SHOTS_WANTED = os.environ.get("PLAYGROUND_SCREENSHOTS", "0") not in ("", "0")
PAGES = [("", "Inference Playground"), ("journey", "The journey of a request"), ("attention", "Attention"),
         ("kv-cache", "The KV cache"), ("speed-lab", "Speed lab"), ("speed-cost", "Speed and cost on GPUs"),
         ("batching", "Batching"), ("room", "The room is the batch"), ("precision", "Precision"), ("quiz", "Quiz"),
         ("recordings", "Recordings"),
         ("attention-math", "Attention, step by step"), ("kv-on-off", "The KV cache, with and without"),
         ("flash-attention", "FlashAttention and kernel fusion"), ("quantization", "Quantization, closely"),
         ("model-folder", "A model is a folder"), ("engines", "Where the real engines do it")]
LAST_TEXT = {"": "paged against contiguous allocation", "journey": "The timeline of the steps appears here",
             "attention": "Grouped-query attention:", "kv-cache": "Paging preempted"}
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 200   # ~2,000 tokens
# The app's own process: every deprecation warning printed (not only the first of each in __main__), so the check
# below fails the day a call the app makes is deprecated (pyproject's filterwarnings covers the test process).
SHOW_DEPRECATIONS = {"PYTHONWARNINGS": "default::DeprecationWarning,default::PendingDeprecationWarning,"
                                       "default::FutureWarning"}
DEPRECATED = re.compile(r"DeprecationWarning|FutureWarning|\bdeprecated\b", re.I)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the app did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def wait_model(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    """Until the OpenAI API of the app answers /v1/models: its one model is loaded (it loads when the server starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"the model was not loaded within {timeout} s:\n{log.read_text()[-3000:]}")


def assert_no_deprecation(log: Path) -> None:
    """Nothing the app's process printed says deprecated (Python's warnings, Streamlit's and transformers' logs)."""
    said = [line for line in log.read_text(errors="replace").splitlines() if DEPRECATED.search(line)]
    assert not said, "the app's process printed deprecations:\n" + "\n".join(said[:20])


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.contextmanager
def running_app(log_dir: Path, env: dict[str, str] | None = None):
    """The app as `make run` starts it (the launcher's own `streamlit run app/asgi.py ...` command: the pages and the
    OpenAI API over one model); its url once the model is loaded."""
    port = free_port()
    log = log_dir / "streamlit.log"
    cmd = [python(), *streamlit_command(settings_of(["--port", str(port)]))[1:]]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **SHOW_DEPRECATIONS, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        wait_model(url, proc, log)
        yield url
    finally:
        stop(proc)
    assert_no_deprecation(log)
    assert "Did not auto detect" not in log.read_text()        # Streamlit's guess, hidden: the launcher says where


# The wide tab: 1400 wide, as tall as a screen; as tall as the page when screenshots are asked for (Streamlit scrolls
# inside the page, so a full-page screenshot holds only the viewport). The checks read the page, not the pixels.
WIDE_TAB = {"width": 1400, "height": 4200 if SHOTS_WANTED else 900}


@pytest.fixture
def page(people):
    return people.person(WIDE_TAB)


def wait_text(page, text: str, timeout_s: float = 60) -> None:
    page.get_by_text(text, exact=False).first.wait_for(timeout=timeout_s * 1000)


def wait_text_or_fail(page, text: str, timeout_s: float) -> None:
    """Until `text` shows or the page shows an error (an exception or an error box): a long job's page that has
    failed fails the test at once, with what it said, instead of waiting out `timeout_s`."""
    page.wait_for_function(
        """(text) => document.body.innerText.includes(text) ||
                     document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]')""",
        arg=text, timeout=timeout_s * 1000)
    failed = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
    assert failed.count() == 0, f"the page failed instead of showing {text!r}: {failed.first.text_content()}"


def wait_heading(page, text: str, timeout_s: float = 90) -> None:
    """A cold start first shows only the sidebar; the page is there when its heading is."""
    page.get_by_role("heading", name=text).first.wait_for(timeout=timeout_s * 1000)


def wait_idle(page, timeout_s: float = 60) -> None:
    """Until no script run is going (the 'running' status widget is gone), no element is left over from the run
    before (Streamlit marks those `data-stale` until the new run replaces or drops them) and every chart has drawn."""
    page.wait_for_function(
        """() => !document.querySelector('[data-testid="stStatusWidget"]') &&
                 !document.querySelector('[data-testid="stSkeleton"]') &&
                 !document.querySelector('[data-stale="true"]') &&
                 [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
                   .every(c => c.querySelector('.main-svg'))""", timeout=timeout_s * 1000)


def assert_no_exception(page) -> None:
    errors = page.locator('[data-testid="stException"]')
    assert errors.count() == 0, errors.first.inner_text()


def shot(page, name: str) -> None:
    if not SHOTS_WANTED:
        return
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def set_number(page, label: str, value: int) -> None:
    box = page.get_by_role("spinbutton", name=label).first
    box.fill(str(value))
    box.press("Enter")
    wait_idle(page)


def set_prompt(page, text: str) -> None:
    box = page.get_by_role("textbox", name="Prompt").first
    box.fill(text)
    box.press("Control+Enter")
    wait_idle(page)


def button(page, name: str):
    """A button of the page itself (Streamlit's status widget has a Stop button of its own), never the stale copy
    a rerun leaves on screen until it draws the new one (a button that moved is briefly there twice)."""
    live = page.get_by_test_id("stMainBlockContainer").locator(
        '[data-testid="stElementContainer"]:not([data-stale="true"])')
    return live.get_by_role("button", name=name)


PROJECTOR = {"width": 1024, "height": 768}      # a classroom projector
# words Streamlit cuts with '…' (metric values and labels, button captions, widget labels) in the main area, and
# buttons (a segmented control's options) running past the column that holds them
CLIPPED_JS = """() => [...document.querySelectorAll(
    '[data-testid="stMainBlockContainer"] [data-testid="stMarkdownContainer"]')]
  .filter(e => e.closest('[data-testid="stMetric"], button, label, [data-testid="stWidgetLabel"]'))
  .filter(e => e.scrollWidth > e.clientWidth + 1)
  .map(e => e.innerText.trim())
  .concat([...document.querySelectorAll('[data-testid="stMainBlockContainer"] [data-testid="stColumn"] button')]
    .filter(b => b.getBoundingClientRect().right >
                 b.closest('[data-testid="stColumn"]').getBoundingClientRect().right + 1)
    .map(b => 'past its column: ' + b.innerText.trim()))"""
# chart text (bar and point labels, ticks, titles, legends) reaching past the chart's own drawing, where it is cut off
OUTSIDE_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
  const box = plot.querySelector('.main-svg').getBoundingClientRect();
  return [...plot.querySelectorAll('.textpoint text, text.bartext, .annotation-text, .xtick text, .ytick text, ' +
                                   '.legendtext, .gtitle, .g-xtitle text, .g-ytitle text')]
    .filter(t => t.textContent.trim())
    .filter(t => { const r = t.getBoundingClientRect();
                   return r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1 ||
                                          r.top < box.top - 1 || r.bottom > box.bottom + 1); })
    .map(t => t.textContent.trim()); })"""


# chart text running into chart text: every label of a chart (points', bars', annotations', ticks, titles, legends) as
# the box it is drawn in, turned as drawn (a rotated tick label is a turned box), checked pairwise by separating axes;
# and a label drawn inside a bar or a shape (a token chip, a box of the shapes diagram) no wider than it
COLLISIONS_JS = """() => {
  // Every text of every plotly chart as an oriented box (its own width and height, turned as drawn), then: no two
  // boxes of one chart intersect (separating axes), and no label drawn inside a bar or a box is wider than it.
  const SEL = '.textpoint text, text.bartext, .annotation-text, .xtick text, .ytick text, .legendtext, .gtitle, ' +
              '.g-xtitle text, .g-ytitle text, .g-x2title text, .g-y2title text, .cbtitle text, .cbaxis text';
  const boxOf = e => {
    const r = e.getBoundingClientRect(), b = e.getBBox(), m = e.getScreenCTM();
    const scale = Math.hypot(m.a, m.b), angle = Math.atan2(m.b, m.a);
    return {cx: (r.left + r.right) / 2, cy: (r.top + r.bottom) / 2, w: b.width * scale, h: b.height * scale * 0.8,
            angle, r};
  };
  const corners = q => [[-1, -1], [1, -1], [1, 1], [-1, 1]].map(([sx, sy]) => {
    const x = sx * q.w / 2, y = sy * q.h / 2;
    return [q.cx + x * Math.cos(q.angle) - y * Math.sin(q.angle), q.cy + x * Math.sin(q.angle) + y * Math.cos(q.angle)];
  });
  const apart = (p, q) => [p.angle, p.angle + Math.PI / 2, q.angle, q.angle + Math.PI / 2].some(t => {
    const ax = [Math.cos(t), Math.sin(t)], proj = c => c.map(([x, y]) => x * ax[0] + y * ax[1]);
    const a = proj(corners(p)), b = proj(corners(q));
    return Math.min(Math.max(...a), Math.max(...b)) - Math.max(Math.min(...a), Math.min(...b)) <= 1;
  });
  const inside = (q, r) => r.left <= q.cx && q.cx <= r.right && r.top <= q.cy && q.cy <= r.bottom;
  return [...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
    const where = `chart at y=${plot.getBoundingClientRect().top | 0}`;
    const texts = [...plot.querySelectorAll(SEL)].filter(t => t.textContent.trim() && t.getBBox().width > 0)
      .map(t => ({t: t.textContent.trim(), e: t, q: boxOf(t)}));
    const out = [];
    for (let i = 0; i < texts.length; i++)
      for (let j = i + 1; j < texts.length; j++)
        if (!apart(texts[i].q, texts[j].q)) out.push(`${where}: '${texts[i].t}' overlaps '${texts[j].t}'`);
    const boxes = [...plot.querySelectorAll('.bars .point path, .shapelayer path')].map(p => p.getBoundingClientRect())
      .filter(r => r.width > 0 && r.height > 0);
    for (const x of texts.filter(x => x.e.matches('.textpoint text, text.bartext, .annotation-text'))) {
      const around = boxes.filter(b => inside(x.q, b)).sort((a, b) => a.width * a.height - b.width * b.height)[0];
      if (around && x.q.r.width > around.width + 1) out.push(`${where}: '${x.t}' is wider than its box`);
    }
    return out;
  });
}"""


def assert_figures_apart(page) -> None:
    """No two labels of a chart overlap, and no label is wider than the chip or box it is written in."""
    assert page.evaluate(COLLISIONS_JS) == [], "chart labels collide"


def assert_nothing_clipped(page) -> None:
    """Every metric value and label, button caption and widget label whole; every chart label inside its chart and
    clear of the others."""
    assert page.evaluate(CLIPPED_JS) == [], "cut off with '…'"
    assert page.evaluate(OUTSIDE_JS) == [], "chart text past the chart's edge"
    assert_figures_apart(page)


def projector_shot(page, name: str) -> None:
    """What the projector shows (1024x768), then the whole page at that width (Streamlit scrolls inside the page)."""
    if not SHOTS_WANTED:
        return
    shot(page, f"projector-{name}")
    page.set_viewport_size({"width": PROJECTOR["width"], "height": 4200})
    wait_idle(page)
    shot(page, f"projector-{name}-full")
    page.set_viewport_size(PROJECTOR)


@pytest.fixture
def projector(people):
    return people.person(PROJECTOR)


def go_to(page, title: str) -> None:
    """Client-side navigation through the sidebar (keeps the session and its last run)."""
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()


def record_timing(name: str, value: float) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / "timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = round(value, 3)
    path.write_text(json.dumps(data, indent=2))
    print(f"\n{name}: {value:.2f}")


@pytest.mark.parametrize("url_path,title", PAGES)
def test_every_page_opens_and_keeps_its_words_on_a_projector(app_url, page, url_path, title):
    """Each page at 1440x900, then the same page narrowed to a classroom projector's 1024x768: every word whole."""
    page.goto(f"{app_url}/{url_path}")
    wait_heading(page, title)
    if url_path in LAST_TEXT:
        wait_text(page, LAST_TEXT[url_path], 60)
    wait_idle(page)
    assert_no_exception(page)
    shot(page, f"page-{url_path or 'home'}")
    page.set_viewport_size(PROJECTOR)                       # the layout reflows in the browser: no rerun needed
    page.wait_for_timeout(500)
    wait_idle(page)
    assert_nothing_clipped(page)
    projector_shot(page, url_path or "home")


def test_a_run_keeps_its_words_on_a_projector(app_url, projector):
    """The metrics a generation brings (journey, attention, KV cache) at 1024x768."""
    projector.goto(f"{app_url}/journey")
    wait_heading(projector, "The journey of a request")
    set_number(projector, "Max new tokens", 12)
    button(projector, "Generate").click()
    wait_text(projector, "Done:", 240)
    wait_text(projector, "Through the layers", 60)
    wait_idle(projector)
    assert_nothing_clipped(projector)
    projector_shot(projector, "journey-generated")
    for title, last, name in (("Attention", "Grouped-query attention:", "attention-generated"),
                              ("The KV cache", "Paging preempted", "kv-cache-generated")):
        go_to(projector, title)
        wait_text(projector, last, 60)
        wait_idle(projector)
        assert_no_exception(projector)
        assert_nothing_clipped(projector)
        projector_shot(projector, name)


def layout_state(page) -> dict:
    return page.evaluate("""() => ({font: getComputedStyle(document.documentElement).fontSize,
                                    folded: !!document.querySelector('[data-testid="stExpandSidebarButton"]'),
                                    address: location.search})""")


def test_presenter_layout_has_big_type_and_the_sidebar_folded(app_url, projector):
    projector.goto(f"{app_url}/speed-cost?layout=presenter")                   # from the address
    wait_heading(projector, "Speed and cost on GPUs")
    wait_idle(projector)
    assert layout_state(projector) == {"font": "20px", "folded": True, "address": "?layout=presenter"}
    assert_nothing_clipped(projector)
    projector_shot(projector, "presenter-speed-cost")

    projector.goto(f"{app_url}/journey")                                        # from the sidebar's toggle
    wait_heading(projector, "The journey of a request")
    assert layout_state(projector) == {"font": "16px", "folded": False, "address": ""}
    projector.get_by_test_id("stSidebar").get_by_text("Presenter layout").click()
    projector.wait_for_function("() => getComputedStyle(document.documentElement).fontSize === '20px'")
    wait_idle(projector)
    assert layout_state(projector) == {"font": "20px", "folded": True, "address": "?layout=presenter"}
    projector.get_by_test_id("stExpandSidebarButton").click()
    go_to(projector, "Speed lab")                                               # it goes with the session
    wait_heading(projector, "Speed lab")
    wait_idle(projector)
    assert layout_state(projector)["font"] == "20px" and "layout=presenter" in layout_state(projector)["address"]
    assert_nothing_clipped(projector)
    projector_shot(projector, "presenter-speed-lab")
    projector.get_by_test_id("stSidebar").get_by_text("Presenter layout").click()  # and off again
    projector.wait_for_function("() => getComputedStyle(document.documentElement).fontSize === '16px'")
    wait_idle(projector)                    # the address changes in a message of its own, after the style's (a CI run
    projector.wait_for_function("() => !location.search.includes('layout=presenter')", timeout=30_000)  # met it late)
    assert "layout=presenter" not in layout_state(projector)["address"]


def test_generate_stop_and_share_the_run(app_url, page):
    page.goto(f"{app_url}/journey")
    wait_heading(page, "The journey of a request")
    set_number(page, "Max new tokens", 250)
    button(page, "Generate").click()
    button(page, "Stop").wait_for(timeout=60_000)
    wait_text(page, "Generating with", 60)
    button(page, "Stop").click()
    wait_text(page, "Stopped after", 60)
    wait_text(page, "kept on the server's disk", 30)    # the stopped runner asked the server (app/runs/run.py settle)
    wait_idle(page)
    assert_no_exception(page)

    set_number(page, "Max new tokens", 12)
    button(page, "Generate").click()
    wait_text_or_fail(page, "Done:", 240)
    wait_text(page, "Through the layers", 60)
    wait_idle(page)
    assert_no_exception(page)
    assert page.get_by_text("Time to first token").count() >= 1
    assert page.get_by_text("One token up close").count() == 1
    assert page.locator(".js-plotly-plot").count() >= 5   # chips, shapes, timeline, distribution, lens
    shot(page, "journey-generated")

    go_to(page, "Attention")
    wait_heading(page, "One head")
    wait_text(page, "Grouped-query attention:", 60)
    wait_idle(page)
    assert_no_exception(page)
    shot(page, "attention-generated")

    go_to(page, "The KV cache")
    wait_text(page, "matches the formula", 60)
    wait_text(page, "Paging preempted", 60)
    wait_idle(page)
    assert_no_exception(page)
    shot(page, "kv-cache-generated")


def test_long_prompt_attention_opens_again_downsampled_and_whole(app_url, page):
    """A 2,000-token run's attention page, left and opened again, draws every chart from the stored run. How long that
    takes is recorded (tests/screenshots/timings.json), not asserted: a test never depends on the machine's speed."""
    page.goto(f"{app_url}/attention")
    wait_heading(page, "Attention")
    set_prompt(page, LONG_PROMPT)
    set_number(page, "Max new tokens", 3)
    button(page, "Generate").click()
    wait_text_or_fail(page, "is downsampled", 400)
    wait_idle(page, 120)
    assert_no_exception(page)
    go_to(page, "Home")
    wait_heading(page, "Inference Playground")
    wait_idle(page)
    start = time.perf_counter()
    go_to(page, "Attention")
    wait_text(page, "Decoding, one step at a time", 60)
    wait_idle(page, 60)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6",
                           timeout=60_000)
    seconds = time.perf_counter() - start
    record_timing("attention_page_render_s_2000_tokens", seconds)
    assert_no_exception(page)
    shot(page, "attention-2000-tokens")
    go_to(page, "The journey of a request")                                          # the same long run there
    wait_text(page, "Through the layers", 60)
    wait_idle(page)
    assert_no_exception(page)
    shot(page, "journey-2000-tokens")


ROOM_PROMPTS = ("What is the capital of France?", "Name three prime numbers.", "Write a haiku about autumn.",
                "What does a GPU do?")


def test_four_sessions_generate_at_once_and_each_gets_its_own_answer(app_url, people, smol_lm):
    """Four browsers press Generate together; the batch serves them all, each with the answer it would get alone."""
    from engine.core.generate import GenerationRequest, generate

    want = [list(generate(smol_lm, GenerationRequest(p, max_new_tokens=12)))[-1].text for p in ROOM_PROMPTS]
    pages = [people.person(WIDE_TAB) for _ in ROOM_PROMPTS]
    for pg, prompt in zip(pages, ROOM_PROMPTS):
        pg.goto(f"{app_url}/journey")
        wait_heading(pg, "The journey of a request")
        set_number(pg, "Max new tokens", 12)
        set_prompt(pg, prompt)
    for pg in pages:
        button(pg, "Generate").click()
    for i, pg in enumerate(pages):
        wait_text(pg, "Done:", 240)
        wait_idle(pg)
        assert_no_exception(pg)
        answers = pg.get_by_test_id("stText").all_inner_texts()
        assert want[i].strip() in [a.strip() for a in answers], (ROOM_PROMPTS[i], want[i], answers)
        shot(pg, f"room-session-{i}")


def test_a_run_survives_a_reload_and_opens_in_a_second_tab(app_url, people):
    """A reload (a new Streamlit session, the same browser cookie: the same person) draws the person's last run
    again, and so does a second tab; both offer it in a notebook."""
    pg = people.person({"width": 1440, "height": 900})
    pg.goto(f"{app_url}/journey")
    wait_heading(pg, "The journey of a request")
    set_number(pg, "Max new tokens", 5)
    set_prompt(pg, "Name one colour of the rainbow.")
    button(pg, "Generate").click()
    wait_text(pg, "Done:", 240)
    wait_idle(pg)
    answer = [a for a in pg.get_by_test_id("stText").all_inner_texts() if a.strip()]
    pg.reload()
    wait_heading(pg, "The journey of a request")
    wait_text(pg, "One token up close", 60)
    wait_idle(pg)
    assert_no_exception(pg)
    assert set(answer) <= set(a for a in pg.get_by_test_id("stText").all_inner_texts() if a.strip())
    assert pg.get_by_role("button", name="Open in a notebook").count() == 1
    second = pg.context.new_page()                                  # a second tab of the same person
    second.set_viewport_size({"width": 1440, "height": 900})
    second.goto(f"{app_url}/attention")
    wait_heading(second, "One head")
    wait_idle(second)
    assert_no_exception(second)
    assert second.get_by_role("button", name="Open in a notebook").count() == 1
