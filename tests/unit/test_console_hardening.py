"""The console's bounds against its own users: session caps per token and tenant whose evictions
never reach a smaller tenant, the sign-in limit per source address, and the payload an edit form
never shows. No network, no sleeps: every clock is injected."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from datetime import timedelta

import pytest

from fastlane.console.forms import JobForm
from fastlane.console.sessions import MAX_PER_TENANT, MAX_PER_TOKEN, MAX_SESSIONS, Session, Sessions
from fastlane.console.signin_limit import BURST, REFILL_SECONDS, SigninLimit
from fastlane.domain.models import JobSpec, Schedule


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def live(sessions: Sessions, *started: Session) -> list[bool]:
    return [sessions.find(s.session_id) is s for s in started]


# --- sessions: caps per token, per tenant, and the node's -----------------------------------------------

def test_the_caps_are_the_documented_ones():
    assert (MAX_PER_TOKEN, MAX_PER_TENANT, MAX_SESSIONS) == (8, 1_000, 10_000)


def test_one_token_signing_in_10050_times_signs_no_one_else_out():
    """The finding's repro: a viewer of tenant a signs in past the node's bound; b stays signed in."""
    sessions = Sessions(monotonic=Clock())
    other = sessions.start("fl_b_token", tenant="b")
    mate = sessions.start("fl_a_other", tenant="a")
    for _ in range(MAX_SESSIONS + 50):
        last = sessions.start("fl_a_viewer", tenant="a")
    assert live(sessions, other, mate, last) == [True, True, True]
    assert sessions.count(tenant="a") == MAX_PER_TOKEN + 1
    assert len(sessions) == MAX_PER_TOKEN + 2


def test_a_token_past_its_cap_ends_its_own_least_recently_used_session():
    clock = Clock()
    sessions = Sessions(monotonic=clock, max_per_token=3)
    first, second, third = (sessions.start("t", tenant="a") for _ in range(3))
    mate = sessions.start("u", tenant="a")
    clock.now += 1
    assert sessions.find(first.session_id) is first  # now second is the token's least recently used
    fourth = sessions.start("t", tenant="a")
    assert sessions.find(second.session_id) is None
    assert live(sessions, first, third, fourth, mate) == [True, True, True, True]


def test_a_tenant_past_its_cap_ends_its_own_least_recently_used_session():
    clock = Clock()
    sessions = Sessions(monotonic=clock, max_per_tenant=3)
    outsider = sessions.start("b1", tenant="b")
    first, second, third = (sessions.start(f"a{i}", tenant="a") for i in range(3))
    clock.now += 1
    assert sessions.find(first.session_id) is first
    fourth = sessions.start("a9", tenant="a")
    assert sessions.find(second.session_id) is None
    assert live(sessions, outsider, first, third, fourth) == [True, True, True, True]
    assert sessions.count(tenant="a") == 3


def test_a_full_node_ends_a_session_of_the_tenant_holding_the_most():
    sessions = Sessions(monotonic=Clock(), max_sessions=5)
    big = [sessions.start(f"a{i}", tenant="a") for i in range(3)]
    small = sessions.start("b1", tenant="b")
    sessions.start("c1", tenant="c")
    sessions.start("c2", tenant="c")  # 6 > 5: a holds the most
    assert sessions.find(big[0].session_id) is None
    assert (sessions.count(tenant="a"), sessions.count(tenant="b"), sessions.count(tenant="c")) == (2, 1, 2)
    own = sessions.start("c3", tenant="c")  # c now holds the most: its own least recently used ends
    assert (sessions.count(tenant="a"), sessions.count(tenant="b"), sessions.count(tenant="c")) == (2, 1, 2)
    assert live(sessions, small, own, *big[1:]) == [True, True, True, True]


def test_on_a_tie_the_full_node_ends_the_signers_own_session():
    sessions = Sessions(monotonic=Clock(), max_sessions=4)
    theirs = [sessions.start(f"a{i}", tenant="a") for i in range(2)]
    sessions.start("b1", tenant="b")
    first = sessions.start("c1", tenant="c")  # full
    second = sessions.start("c2", tenant="c")  # c 2, a 2: a tie, so c's own least recently used
    assert live(sessions, *theirs, second) == [True, True, True]
    assert sessions.find(first.session_id) is None
    assert (sessions.count(tenant="a"), sessions.count(tenant="b"), sessions.count(tenant="c")) == (2, 1, 1)


def test_random_sign_ins_keep_every_cap_and_never_shrink_a_smaller_tenant():
    rng = random.Random(20261125)
    sessions = Sessions(monotonic=Clock(), max_sessions=40, max_per_token=3, max_per_tenant=12)
    started: list[Session] = []
    for _ in range(3_000):
        tenant = rng.choice("abcdefg")
        token = f"{tenant}-{rng.randint(0, 6)}"
        before = Counter(s.tenant for s in started if sessions.find(s.session_id) is s)
        session = sessions.start(token, tenant=tenant)
        started.append(session)
        after = Counter(s.tenant for s in started if sessions.find(s.session_id) is s)
        assert sessions.find(session.session_id) is session
        assert len(sessions) <= 40 and after[tenant] <= 12
        assert max(Counter(s.token for s in started if sessions.find(s.session_id) is s).values()) <= 3
        for other, count in before.items():
            if other != tenant and after[other] < count:  # it lost one: it held more than the signer now does
                assert count > after[tenant] and before.total() == 40, (other, tenant, before, after)
        started = [s for s in started if sessions.find(s.session_id) is s]


def test_ended_and_expired_sessions_leave_no_count_behind():
    clock = Clock()
    sessions = Sessions(monotonic=clock, idle_seconds=60.0, max_per_token=2)
    kept = sessions.start("t", tenant="a")
    ended = sessions.start("t", tenant="a")
    sessions.end(ended.session_id)
    assert sessions.count(tenant="a") == 1
    clock.now += 61
    assert sessions.find(kept.session_id) is None
    assert sessions.count(tenant="a") == 0 and len(sessions) == 0
    again = [sessions.start("t", tenant="a") for _ in range(2)]
    assert live(sessions, *again) == [True, True]


def test_caps_below_one_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Sessions(max_per_token=0)


# --- the sign-in limit ---------------------------------------------------------------------------------------

def test_the_limit_is_the_documented_one():
    assert (BURST, REFILL_SECONDS) == (10, 6.0)


def test_a_source_has_its_burst_then_one_attempt_every_refill():
    clock = Clock()
    limit = SigninLimit(monotonic=clock)
    assert [limit.take("198.51.100.7") for _ in range(BURST)] == [0.0] * BURST
    assert limit.take("198.51.100.7") == pytest.approx(REFILL_SECONDS)
    clock.now += 2.0
    assert limit.take("198.51.100.7") == pytest.approx(REFILL_SECONDS - 2.0)  # a refused attempt takes nothing
    clock.now += REFILL_SECONDS - 2.0
    assert limit.take("198.51.100.7") == 0.0
    assert limit.take("198.51.100.7") == pytest.approx(REFILL_SECONDS)


def test_an_idle_source_gets_back_its_burst_and_no_more():
    clock = Clock()
    limit = SigninLimit(monotonic=clock)
    for _ in range(BURST):
        limit.take("a")
    clock.now += 3600.0
    assert [limit.take("a") for _ in range(BURST)] == [0.0] * BURST
    assert limit.take("a") > 0


def test_sources_are_limited_apart():
    limit = SigninLimit(monotonic=Clock(), burst=2)
    assert [limit.take("a") for _ in range(3)][-1] > 0
    assert limit.take("b") == 0.0
    assert limit.take("") == 0.0  # no peer address (a Unix socket): one bucket of its own


def test_the_limiter_remembers_a_bounded_number_of_sources():
    clock = Clock()
    limit = SigninLimit(monotonic=clock, burst=1, max_sources=3)
    for source in ("a", "b", "c"):
        limit.take(source)
    assert limit.take("a") > 0  # a is the most recently seen now; b the least
    limit.take("d")
    assert len(limit) == 3
    assert limit.take("b") == 0.0  # forgotten: a full bucket again
    assert limit.take("a") > 0


# --- the edit form never shows a payload, and keeps it when left empty ------------------------------

SPEC = JobSpec(tenant="acme", name="sync", job_type="sync.v1", schedule=Schedule.interval(timedelta(minutes=5)),
               payload=b'{"iban": "DE-SECRET"}')


def test_an_edit_form_never_carries_the_payload():
    form = JobForm.from_spec(SPEC)
    assert form.payload == "" and "DE-SECRET" not in repr(form)


def test_an_edit_left_empty_keeps_the_payload_a_filled_one_replaces_it_a_cleared_one_empties_it():
    shown = JobForm.from_spec(SPEC)
    fields = {f.name: getattr(shown, f.name) for f in dataclasses.fields(JobForm)}
    assert JobForm.from_fields(fields).spec(tenant="acme", based_on=SPEC).payload == SPEC.payload
    assert JobForm.from_fields({**fields, "payload": " "}).spec(tenant="acme", based_on=SPEC).payload == SPEC.payload
    assert JobForm.from_fields({**fields, "payload": '{"n": 2}'}).spec(tenant="acme", based_on=SPEC).payload == \
        b'{"n": 2}'
    cleared = JobForm.from_fields({**fields, "clear_payload": "on"})
    assert cleared.spec(tenant="acme", based_on=SPEC).payload == b""
    typed = JobForm.from_fields({**fields, "clear_payload": "on", "payload": "[1]"})
    assert typed.spec(tenant="acme", based_on=SPEC).payload == b"[1]"  # what is typed wins


def test_a_new_job_left_empty_has_no_payload():
    assert JobForm.from_fields({"name": "n", "job_type": "t", "schedule": "now"}).spec(tenant="acme").payload == b""
