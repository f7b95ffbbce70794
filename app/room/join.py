"""The hosted room's door, in the browser: the join form, the link's `?join=` code, the member cookie, and the
presenter's join link with its QR code. The rules (codes, members, rotation, closing, wrong tries) live in
engine/service/join.py; this module only draws and carries.

    admit(menu)          # app/main.py, before the model or the room's seat: a stranger sees the join form only
    join_panel()         # the presenter's sidebar: the link, its QR code, a new code, closing the room

A browser that joined keeps a member token (never the code) in a cookie, so a reload or a new tab reads it
from the first request and is let in at once. The code leaves the address bar as soon as it was read, so a
shared screen or a copied address does not carry it.
"""
from __future__ import annotations

import io
import re
from typing import Any, Mapping
from urllib.parse import urlsplit

import streamlit as st

from app.hosting.model import get_model, model_choice, settings
from app.room.presenter import TOKEN_KEY
from app.room.session import person_id
from engine.service.join import MEMBER_SECONDS, JoinGate, JoinRefused, room_gate

QUERY_KEY = "join"                       # http://host:8501/?join=k7mq-3xtp-9wha
COOKIE = "playground_member"
MEMBER_KEY, OPEN_KEY = "join.member", "join.open"
TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")


def current_gate() -> JoinGate:
    """The room's gate: this process's own, or, when the model is in a model server (several web processes), the
    server's, so that one code and one set of members hold for every web process. Connecting to the server runs
    nothing on the model."""
    if model_choice().url:
        client = get_model()
        if client is not None:
            return client.gate
    return room_gate()


def admit(menu: Mapping[str, list[Any]]) -> None:
    """Return when this browser may use the room; otherwise draw only the join form and end the run here."""
    gate = current_gate()
    if not gate.required():
        return
    code, message = link_code(), None
    token = member_token(gate)
    if token is None and code:
        token, message = try_join(gate, code)
    if token is not None:
        st.session_state[MEMBER_KEY] = token
        keep_cookie(token)
        return
    st.navigation(menu, position="hidden")           # the pages stay known (no 'page not found'), none runs
    join_form(gate, message)
    st.stop()


def member_token(gate: JoinGate) -> str | None:
    """This session's member token, or the one the browser's cookie brought, if the gate admits it."""
    for token in (st.session_state.get(MEMBER_KEY), cookies().get(COOKIE)):
        if isinstance(token, str) and gate.admits(token):
            return token
    return None


def link_code() -> str | None:
    """The code the join link carried, taken out of the address bar."""
    code = st.query_params.get(QUERY_KEY)
    if code is not None:
        del st.query_params[QUERY_KEY]
    return code or None


def try_join(gate: JoinGate, code: str) -> tuple[str | None, str | None]:
    """(member token, None) for the right code, else (None, why not)."""
    client, address = client_keys()
    try:
        return gate.join(code[:200], client, address), None
    except JoinRefused as err:
        text = str(err)
        return None, text[0].upper() + text[1:] + "."


def client_keys() -> tuple[str, str]:
    """Who is trying, for the wrong-code wait: this browser (its Streamlit cookie, hashed) and its address."""
    try:
        address = st.context.ip_address or ""
    except Exception:  # noqa: BLE001 - no client outside a browser (tests, scripts)
        address = ""
    return person_id(), address


def cookies() -> Mapping[str, str]:
    try:
        return st.context.cookies
    except Exception:  # noqa: BLE001 - no cookies outside a browser (tests, scripts)
        return {}


def keep_cookie(token: str) -> None:
    """Write the member cookie in the browser until a page load brings it back (Streamlit cannot set cookies)."""
    if cookies().get(COOKIE) == token or not TOKEN_CHARS.match(token):
        return
    script = (f"document.cookie = '{COOKIE}={token}; Path=/; Max-Age={MEMBER_SECONDS}; SameSite=Strict' + "
              "(location.protocol === 'https:' ? '; Secure' : '');")
    with st.container(key="join-cookie"):                       # hidden: no gap above the page
        st.html(f"<style>:has(> .st-key-join-cookie) {{ display: none; }}</style><script>{script}</script>",
                unsafe_allow_javascript=True)


def join_form(gate: JoinGate, message: str | None) -> None:
    """The only thing a stranger sees: what this is, and a box for the code."""
    st.title("Join the room")
    st.write("This Inference Playground is hosted for a workshop. Open the join link you were given (or scan "
             "the QR code the presenter shows), or type the room's join code.")
    with st.form("join.form", clear_on_submit=True, enter_to_submit=True):
        code = st.text_input("Join code", placeholder="xxxx-xxxx-xxxx", max_chars=64)
        submitted = st.form_submit_button("Join", type="primary")
    if submitted and code:
        token, message = try_join(gate, code)
        if token is not None:
            st.session_state[MEMBER_KEY] = token
            st.rerun()
    if message:
        st.error(message)


# --- the presenter's side --------------------------------------------------------------------------------------

def public_base() -> str:
    """Where participants reach this server: its public_url setting (--public-url), else the address this browser
    used."""
    given = settings().public_url
    if given:
        return given.rstrip("/")
    try:
        url = urlsplit(st.context.url or "")
    except Exception:  # noqa: BLE001 - no browser (tests)
        url = urlsplit("")
    return f"{url.scheme}://{url.netloc}" if url.netloc else "http://localhost:8501"


def join_link(code: str, base: str | None = None) -> str:
    return f"{base or public_base()}/?{QUERY_KEY}={code}"


def qr_png(text: str, scale: int = 10) -> bytes:
    """A QR code of `text` as PNG bytes (segno: no image library needed)."""
    import segno  # the QR code: only when the presenter opens the join panel

    out = io.BytesIO()
    segno.make(text, error="m").save(out, kind="png", scale=scale, border=2)
    return out.getvalue()


def join_panel() -> None:
    """For the presenter of a room with a join code: the link and its QR code, a new code, closing the room."""
    gate, presenter = current_gate(), st.session_state.get(TOKEN_KEY)
    code = gate.code(presenter=presenter)
    if code is None:
        return
    link = join_link(code)
    with st.expander("Join link", expanded=True):
        st.code(link, language=None, wrap_lines=True)
        st.image(qr_png(link), caption=f"Join code: {code}", width="stretch")
        if st.button("Show it large", key="join.large", icon=":material/qr_code_2:"):
            show_large(link, code)
        st.session_state[OPEN_KEY] = not gate.closed()         # what the gate says, whoever changed it
        st.toggle("Newcomers may join", key=OPEN_KEY,
                  on_change=lambda: gate.close(not st.session_state[OPEN_KEY], presenter=presenter),
                  help="Off: nobody new gets in, whatever code they give; everyone already in stays in.")
        st.button("New join code", key="join.rotate", on_click=lambda: gate.rotate(presenter=presenter),
                  icon=":material/autorenew:",
                  help="Everyone already in stays in; the old link and code stop working.")


@st.dialog("Join this room", width="large")
def show_large(link: str, code: str) -> None:
    """The link and its QR code as large as the projector allows."""
    left, right = st.columns([3, 2], vertical_alignment="center")
    left.image(qr_png(link, scale=16), width="stretch")
    right.markdown(f"Scan the code, or open\n\n**{link}**\n\nJoin code: **{code}**")
