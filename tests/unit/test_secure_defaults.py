"""Secure by default: what a node may listen on without tokens and TLS, and the tokens command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastlane.auth import secrets
from fastlane.cli.main import main
from fastlane.errors import ConfigurationError
from fastlane.server.settings import Settings

CERT, KEY, CA = Path("cert.pem"), Path("key.pem"), Path("ca.pem")


@pytest.mark.parametrize("settings, missing", [
    (dict(listen="0.0.0.0:7070"), "--auth and --tls-cert/--tls-key"),
    (dict(listen="0.0.0.0:7070", auth=True), "--tls-cert/--tls-key"),
    (dict(listen="0.0.0.0:7070", tls_cert=CERT, tls_key=KEY), "--auth"),
    (dict(metrics_listen="0.0.0.0:9090"), "--auth"),
    (dict(console_listen="0.0.0.0:8080"), "--auth and --tls-cert/--tls-key"),
    (dict(console_listen="0.0.0.0:8080", auth=True), "--tls-cert/--tls-key"),
])
def test_a_public_address_needs_tokens_and_tls_or_insecure(settings, missing):
    with pytest.raises(ConfigurationError) as refused:
        Settings(**settings)
    assert f"it needs {missing} " in str(refused.value)
    assert "--insecure" in str(refused.value)
    Settings(**settings, insecure=True)  # allowed, for development


@pytest.mark.parametrize("settings", [
    dict(listen="0.0.0.0:7070", auth=True, tls_cert=CERT, tls_key=KEY),
    dict(listen="0.0.0.0:7070", auth=True, tls_cert=CERT, tls_key=KEY, tls_client_ca=CA),
    dict(listen="127.0.0.1:7070"),  # loopback: a development node needs nothing
    dict(metrics_listen="0.0.0.0:9090", auth=True),
    dict(health_listen="0.0.0.0:7071"),  # health tells SERVING or not, nothing else
    dict(console_listen="127.0.0.1:8080"),  # the console on loopback, like the API
    dict(console_listen="0.0.0.0:8080", auth=True, tls_cert=CERT, tls_key=KEY),
])
def test_what_a_node_may_listen_on(settings):
    Settings(**settings)


@pytest.mark.parametrize("settings, problem", [
    (dict(tls_cert=CERT), "--tls-cert and --tls-key go together"),
    (dict(tls_key=KEY), "--tls-cert and --tls-key go together"),
    (dict(tls_client_ca=CA), "--tls-client-ca (mutual TLS) needs --tls-cert"),
])
def test_tls_flags_that_cannot_work_are_refused(settings, problem):
    with pytest.raises(ConfigurationError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Settings(**settings)


def test_tokens_made_list_and_revoked_directly_against_the_database(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/fresh.db"  # not even migrated yet: the first admin token comes first

    assert main(["tokens", "create", "--db", db, "--tenant", "ops", "--role", "admin", "--name", "bootstrap",
                 "--expires", "30d", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert (created["tenant"], created["role"], created["name"]) == ("ops", "admin", "bootstrap")
    parsed = secrets.parse(created["secret"])
    assert parsed is not None and parsed.token_id == created["token_id"]

    assert main(["tokens", "list", "--db", db]) == 0
    listing = capsys.readouterr().out
    assert created["token_id"] in listing and "bootstrap" in listing
    assert created["secret"] not in listing and parsed.secret not in listing

    assert main(["tokens", "revoke", "--db", db, created["token_id"]]) == 0
    assert f"revoked token {created['token_id']}" in capsys.readouterr().out
    assert main(["tokens", "list", "--db", db, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["revoked_at"] is not None


@pytest.mark.parametrize("argv, message", [
    (["tokens", "create", "--tenant", "ops", "--role", "owner"], "invalid choice"),
    (["tokens", "create", "--tenant", "ops", "--role", "admin", "--expires", "soon"], "expected a duration of a second or more"),
    (["tokens", "create", "--tenant", "ops", "--role", "admin", "--expires", "0d"], "expected a duration of a second or more"),
])
def test_token_flags_are_checked(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_bad_tenant_name_is_refused(tmp_path, capsys):
    assert main(["tokens", "create", "--db", f"sqlite:///{tmp_path}/x.db", "--tenant", "no spaces",
                 "--role", "client"]) == 1
    assert "--tenant" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["quotas", "set", "--tenant", "a"], "give at least one limit"),
    (["quotas", "set", "--tenant", "a", "--reset", "--max-jobs", "3"], "give it alone"),
    (["quotas", "set", "--tenant", "a", "--max-jobs", "-3"], "max_jobs"),
])
def test_quota_overrides_are_checked_before_any_call(argv, message, capsys):
    assert main([*argv, "--server", "127.0.0.1:1"]) == 1  # nothing listens there: never reached
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--quota-max-jobs", "-1"), ("--quota-max-jobs", "lots"),
                                         ("--quota-job-creations-per-second", "inf")])
def test_quota_defaults_on_serve_are_checked(flag, value, capsys):
    assert main(["serve", flag, value]) == 2
    assert flag in capsys.readouterr().err


def test_unlimited_quota_defaults_are_none():
    from fastlane.cli.arguments import count_or_unlimited, rate_or_unlimited

    assert (count_or_unlimited("unlimited"), rate_or_unlimited("Unlimited")) == (None, None)
    assert (count_or_unlimited("0"), rate_or_unlimited("2.5")) == (0, 2.5)
