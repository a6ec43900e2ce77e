"""Signed-in browsers: a random session id in a cookie, the API token it stands for kept in memory.

The cookie carries only the session id (``HttpOnly``, ``SameSite=Strict``, ``Secure`` under TLS):
the token itself never reaches the browser again after sign-in, and is never rendered. Each
request checks the token anew through the node's authenticator (cached for seconds), so a token
revoked or expired ends its sessions as it ends API calls. Each session also has its own CSRF
token, which every form carries and every action must present.

Sessions live in this node's memory: a restart or another node behind the same address means
signing in again, which is the price of never writing a token to disk here.

Memory is bounded without letting one token or one tenant sign others out. A token holds at most
:data:`MAX_PER_TOKEN` sessions and a tenant :data:`MAX_PER_TENANT`: a sign-in beyond either ends
the least recently used session of that same token or tenant. Past :data:`MAX_SESSIONS` on the
node, the session that ends is the least recently used one of the tenant holding the most (the
signer's own on a tie). So a sign-in ends another tenant's session only when the node is full and
that tenant holds more sessions than the signer's; one token, which holds at most eight, can never
end a session of a tenant holding eight or fewer.
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
# A person's browsers and devices, or a few people sharing a token, stay under 8; a token signing in
# more often than that is a script, and then it only ends its own sessions.
MAX_PER_TOKEN = 8
# More people of one tenant than this at once on one node's console is beyond what it is for; ten
# tenants at this cap still fit in MAX_SESSIONS.
MAX_PER_TENANT = 1_000
# A session is a few hundred bytes: this bounds the console's memory to a few megabytes.
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    session_id: str
    token: str | None  # None: the node requires no tokens
    tenant: str | None  # the token's tenant; None when the node requires no tokens
    created_at: float
    last_seen: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def csrf_matches(self, presented: str | None) -> bool:
        """Whether a form's CSRF field is this session's (compared in constant time)."""
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Sessions:
    """The signed-in sessions of one node's console, each in three least-recently-used orders:
    the node's, its token's and its tenant's."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, idle_seconds: float = IDLE_SECONDS,
                 lifetime_seconds: float = LIFETIME_SECONDS, max_sessions: int = MAX_SESSIONS,
                 max_per_token: int = MAX_PER_TOKEN, max_per_tenant: int = MAX_PER_TENANT) -> None:
        if min(max_sessions, max_per_token, max_per_tenant) < 1:
            raise ValueError("session caps must be at least 1")
        self._monotonic = monotonic
        self._idle = idle_seconds
        self._lifetime = lifetime_seconds
        self._max = max_sessions
        self._max_per_token = max_per_token
        self._max_per_tenant = max_per_tenant
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._by_token: dict[str | None, OrderedDict[str, Session]] = {}
        self._by_tenant: dict[str | None, OrderedDict[str, Session]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def count(self, *, tenant: str | None) -> int:
        """How many sessions a tenant holds (live or not yet found to be over)."""
        return len(self._by_tenant.get(tenant, ()))

    def start(self, token: str | None, *, tenant: str | None = None) -> Session:
        """A new session for a token that has just been checked, of the token's ``tenant``.

        Ends, if need be, the token's least recently used session (past :data:`MAX_PER_TOKEN`),
        the tenant's (past :data:`MAX_PER_TENANT`), and past :data:`MAX_SESSIONS` one of the
        tenant holding the most sessions, this one on a tie.
        """
        now = self._monotonic()
        session = Session(session_id=secrets.token_urlsafe(32), token=token, tenant=tenant, created_at=now,
                          last_seen=now)
        self._sessions[session.session_id] = session
        self._by_token.setdefault(token, OrderedDict())[session.session_id] = session
        self._by_tenant.setdefault(tenant, OrderedDict())[session.session_id] = session
        while len(self._by_token[token]) > self._max_per_token:
            self._drop(next(iter(self._by_token[token])))
        while len(self._by_tenant[tenant]) > self._max_per_tenant:
            self._drop(next(iter(self._by_tenant[tenant])))
        while len(self._sessions) > self._max:
            largest = max(self._by_tenant, key=lambda t: (len(self._by_tenant[t]), t == tenant))
            self._drop(next(iter(self._by_tenant[largest])))
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
            self._drop(session_id)
            return None
        session.last_seen = now
        self._sessions.move_to_end(session_id)
        self._by_token[session.token].move_to_end(session_id)
        self._by_tenant[session.tenant].move_to_end(session_id)
        return session

    def end(self, session_id: str) -> None:
        self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        for index, key in ((self._by_token, session.token), (self._by_tenant, session.tenant)):
            kept = index[key]
            del kept[session_id]
            if not kept:
                del index[key]
