"""The join gate of a hosted room: who may use the model at all.

A room on a public address asks for a join code (`playground --host 0.0.0.0` makes one up). A browser that
gives the right code gets a member token: an opaque string, signed here, that the browser keeps in a cookie.
The gate checks a token by its signature and age alone, so it remembers no browser, and any web process
that asks the same gate admits the same member (reloads, new tabs, another web process).

    gate = JoinGate("k7mq-3xtp-9wha")
    token = gate.join("K7MQ 3XTP 9WHA", client="person-1", address="203.0.113.7")   # JoinRefused when not
    gate.admits(token)           # True, also after the presenter's gate.rotate()
    gate.rotate()                # a new code: members stay in, the old link is refused
    gate.close(True)             # nobody new gets in, whatever code they give; members stay in

Codes are compared ignoring case, spaces and dashes, in constant time (their SHA-256 digests). Wrong codes
are rate-limited as presenter-token guesses are (app/room/presenter.py): after a few free tries, each next one
waits twice as long as the one before, per browser (`client`) and, more loosely, per network address (a
room behind one NAT shares it). A code the presenter replaced is refused with a clear message and is not
counted as a guess. The gate is thread-safe, has no UI and takes and returns only strings and booleans.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Mapping

from engine import settings
from engine.store import store_dir

JOIN_CODE_ENV = "PLAYGROUND_JOIN_CODE"
CODE_ALPHABET = "23456789abcdefghjkmnpqrstuvwxyz"     # no 0/o, 1/l/i: read off a projector, typed on a phone
CODE_GROUPS, GROUP_CHARS = 3, 4                       # k7mq-3xtp-9wha: 31^12, about 59 bits
MIN_CODE_CHARS = 8
MEMBER_SECONDS = 24 * 3600                            # a member token lasts a workshop day
FREE_GUESSES, FREE_GUESSES_PER_ADDRESS = 3, 20        # wrong codes before each next try waits
GUESS_DELAY_SECONDS, MAX_GUESS_DELAY_SECONDS = 2.0, 300.0   # 2, 4, 8 ... seconds, at most 5 minutes
FORGET_GUESSES_SECONDS = 3600.0                       # a client quiet this long starts afresh
MAX_TRACKED = 4096                                    # clients and addresses remembered, the oldest dropped
OLD_CODES = 16                                        # replaced codes recognised as such
TOKEN_VERSION = "m1"


class JoinRefused(Exception):
    """The gate said no; `wait_seconds` > 0 when the next try must wait."""

    def __init__(self, message: str, wait_seconds: float = 0.0):
        super().__init__(message)
        self.wait_seconds = wait_seconds


def new_code() -> str:
    """A fresh join code, three groups of four characters: 'k7mq-3xtp-9wha'."""
    chars = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_GROUPS * GROUP_CHARS))
    return "-".join(chars[i:i + GROUP_CHARS] for i in range(0, len(chars), GROUP_CHARS))


def normalized(code: str) -> str:
    """What is compared: lower case, without spaces and dashes."""
    return "".join(code.split()).replace("-", "").lower()


def checked_code(code: str) -> str:
    """A join code given at launch, as given; ValueError when it is too short or would not fit in a link."""
    if not all(c.isascii() and (c.isalnum() or c in "-_") for c in code):
        raise ValueError("a join code may hold only letters, digits, '-' and '_' (it goes into the join link)")
    if len(normalized(code)) < MIN_CODE_CHARS:
        raise ValueError(f"a join code must have at least {MIN_CODE_CHARS} letters or digits")
    return code


def _digest(code: str) -> bytes:
    return hashlib.sha256(normalized(code).encode("utf-8", "replace")).digest()


def guess_wait(wrong: int, last: float, now: float, free: int = FREE_GUESSES) -> float:
    """Seconds before the next try after `wrong` wrong codes, the last at `last` (app/room/presenter.py's rule)."""
    if wrong < free:
        return 0.0
    delay = min(GUESS_DELAY_SECONDS * 2 ** (wrong - free), MAX_GUESS_DELAY_SECONDS)
    return max(0.0, last + delay - now)


class _Guesses:
    """Wrong codes per key: (count, time of the last, digest of the last), the oldest keys forgotten."""

    def __init__(self, free: int):
        self.free = free
        self._seen: OrderedDict[str, tuple[int, float, bytes]] = OrderedDict()

    def get(self, key: str, now: float) -> tuple[int, float, bytes]:
        wrong, last, digest = self._seen.get(key, (0, 0.0, b""))
        if wrong and now - last > FORGET_GUESSES_SECONDS:
            self._seen.pop(key, None)
            return 0, 0.0, b""
        return wrong, last, digest

    def wait(self, key: str, now: float) -> float:
        wrong, last, _ = self.get(key, now)
        return guess_wait(wrong, last, now, self.free) if key else 0.0

    def count(self, key: str, now: float, digest: bytes) -> None:
        if not key:
            return
        wrong, _, _ = self.get(key, now)
        self._seen[key] = (wrong + 1, now, digest)
        self._seen.move_to_end(key)
        while len(self._seen) > MAX_TRACKED:
            self._seen.popitem(last=False)

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)


class JoinGate:
    """The current code, the codes it replaced, whether newcomers may join, and the wrong tries so far."""

    def __init__(self, code: str | None, secret: bytes | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self._lock = threading.Lock()
        self._code = code
        self._digest = _digest(code) if code else b""
        self._old: list[bytes] = []
        self._closed = False
        self._secret = secret or secrets.token_bytes(32)
        self._clock, self._wall = clock, wall
        self._by_client, self._by_address = _Guesses(FREE_GUESSES), _Guesses(FREE_GUESSES_PER_ADDRESS)

    # --- what anyone may ask -------------------------------------------------------------------------------

    def required(self) -> bool:
        """Whether this room asks for a code at all (False: an open room, e.g. on loopback)."""
        return self._code is not None

    def admits(self, token: str | None) -> bool:
        """Whether `token` is a member token this gate signed within the last MEMBER_SECONDS."""
        if not self.required():
            return True
        parts = token.split(".") if isinstance(token, str) and len(token) < 200 else []
        if len(parts) != 4 or parts[0] != TOKEN_VERSION or not parts[1].isdigit():
            return False
        if not hmac.compare_digest(self._sign(".".join(parts[:3])), parts[3]):
            return False
        return 0 <= self._wall() - int(parts[1]) <= MEMBER_SECONDS

    def join(self, code: str, client: str, address: str = "") -> str:
        """A member token for the right code; JoinRefused (with how long to wait, if so) otherwise.

        `client` is the browser (a cookie's hash, say), `address` its network address ('' when unknown).
        """
        now, digest = self._clock(), _digest(code)
        with self._lock:
            self._refuse_early(client, address, digest, now)
            if hmac.compare_digest(digest, self._digest):
                self._by_client.forget(client)
                return self._member_token()
            if any(hmac.compare_digest(digest, old) for old in self._old):
                raise JoinRefused("that join code was replaced by a new one: ask the presenter for the new link")
            self._by_client.count(client, now, digest)
            self._by_address.count(address, now, digest)
        raise JoinRefused("that is not the join code")

    # --- what only the presenter's page asks -------------------------------------------------------------------

    def code(self, presenter: str | None = None) -> str | None:
        """The current code, for the presenter's join link (`presenter`: their token, which a model server checks;
        here the page has checked it)."""
        with self._lock:
            return self._code

    def rotate(self, presenter: str | None = None) -> str:
        """A new code: the old one (and its link) stops working, members stay in. Returns the new code."""
        with self._lock:
            if self._code is None:
                raise JoinRefused("this room is open: it has no join code to replace")
            self._old = [self._digest, *self._old][:OLD_CODES]
            self._code = new_code()
            self._digest = _digest(self._code)
            return self._code

    def close(self, closed: bool, presenter: str | None = None) -> None:
        """Close the room to newcomers (members stay in), or open it again."""
        with self._lock:
            self._closed = bool(closed)

    def closed(self) -> bool:
        with self._lock:
            return self._closed

    # --- inside ------------------------------------------------------------------------------------------------

    def _refuse_early(self, client: str, address: str, digest: bytes, now: float) -> None:
        """Refusals that compare nothing: waiting after wrong codes, the same wrong code again, a closed room."""
        wrong, _, last_digest = self._by_client.get(client, now)
        if wrong and client and hmac.compare_digest(digest, last_digest):
            raise JoinRefused("that is not the join code")              # the same try again is not a new guess
        wait = max(self._by_client.wait(client, now), self._by_address.wait(address, now))
        if wait > 0:
            raise JoinRefused(f"too many wrong join codes from this browser: wait {wait:.0f} s, then try again",
                              wait)
        if self._closed:
            raise JoinRefused("the room is closed to newcomers: ask the presenter")

    def _member_token(self) -> str:
        body = f"{TOKEN_VERSION}.{int(self._wall())}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._sign(body)}"

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._secret, body.encode(), hashlib.sha256).digest()[:18]
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")


# --- the process-wide gate ------------------------------------------------------------------------------------

_GATE: JoinGate | None = None
_GATE_LOCK = threading.Lock()


def gate_from_env(environ: Mapping[str, str] | None = None) -> JoinGate:
    """A gate with the launch's code (PLAYGROUND_JOIN_CODE), or an open one when there is none."""
    code = settings.of(environ).join_code
    return JoinGate(code, member_secret(store_dir(environ)) if code else None)


def member_secret(folder: Path) -> bytes | None:
    """The key member tokens are signed with, kept beside the run store (`member.key`, readable by this user only),
    so that members stay in across a restart of the model server or of the whole room. None (a key for this process
    alone) when the folder cannot be written."""
    path = folder / "member.key"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            tmp = folder / f".member.key.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)                 # made whole, or another process made it first: both read the same
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        key = path.read_bytes()
    except OSError:
        return None
    return key if len(key) == 32 else None


def room_gate() -> JoinGate:
    """The one gate of this process (made from the environment at first use)."""
    global _GATE
    with _GATE_LOCK:
        if _GATE is None:
            _GATE = gate_from_env()
        return _GATE
