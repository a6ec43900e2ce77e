"""Signed-in browsers: a random session id in a cookie, the API token it stands for kept in memory.

The cookie carries only the session id (``HttpOnly``, ``SameSite=Strict``, ``Secure`` under TLS):
the token itself never reaches the browser again after sign-in, and is never rendered. Each
request checks the token anew through the node's authenticator (cached for seconds), so a token
revoked or expired ends its sessions as it ends API calls. Each session also has its own CSRF
token, which every form carries and every action must present.

Sessions live in this node's memory: a restart or another node behind the same address means
signing in again, which is the price of never writing a token to disk here.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

COOKIE = "fastlane_session"
IDLE_SECONDS = 8 * 3600.0  # a session unused this long is over
LIFETIME_SECONDS = 24 * 3600.0  # and any session after this long
MAX_SESSIONS = 10_000  # beyond it the least recently used session ends (a flood of sign-ins)


@dataclass(slots=True)
class Session:
    session_id: str
    token: str | None  # None: the node requires no tokens
    created_at: float
    last_seen: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def csrf_matches(self, presented: str | None) -> bool:
        """Whether a form's CSRF field is this session's (compared in constant time)."""
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Sessions:
    """The signed-in sessions of one node's console."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, idle_seconds: float = IDLE_SECONDS,
                 lifetime_seconds: float = LIFETIME_SECONDS, max_sessions: int = MAX_SESSIONS) -> None:
        self._monotonic = monotonic
        self._idle = idle_seconds
        self._lifetime = lifetime_seconds
        self._max = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, token: str | None) -> Session:
        """A new session for a token that has just been checked."""
        now = self._monotonic()
        session = Session(session_id=secrets.token_urlsafe(32), token=token, created_at=now, last_seen=now)
        self._sessions[session.session_id] = session
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's id, or None (unknown, idle too long, too old)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._monotonic()
        if now - session.last_seen > self._idle or now - session.created_at > self._lifetime:
            del self._sessions[session_id]
            return None
        session.last_seen = now
        self._sessions.move_to_end(session_id)
        return session

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
