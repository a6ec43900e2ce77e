"""The ``fastlane`` command line, run in-process: parsing, local validation, output and errors.

Nothing here needs a daemon; commands that would reach one are pointed at a closed port.
"""

from __future__ import annotations

import argparse
import io
import math
import socket
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

import fastlane.cli.remote
from fastlane.auth.tls import ClientTls
from fastlane.cli import arguments
from fastlane.cli.arguments import json_document
from fastlane.cli.main import main
from fastlane.cli.output import format_fields, format_table
from fastlane.engine.dispatch.reserve import PriorityReserve
from fastlane.errors import ConfigurationError, InvalidArgument
from fastlane.server.settings import Settings
from fastlane.storage import redacted_url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a command tries to open a connection."""

    def refuse(args: object) -> None:
        raise AssertionError("the command tried to reach a daemon")

    monkeypatch.setattr(fastlane.cli.remote, "open_client", refuse)


# -- preview -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            "2027-03-13T12:00:00Z",
            [
                ("2027-03-14T07:00:00Z", "2027-03-14T03:00:00-04:00",  # 02:30 does not exist: first instant after
                 "moved: its time fell in the gap when clocks jumped from 02:00 to 03:00; "
                 "it fires at the first valid instant after"),
                ("2027-03-15T06:30:00Z", "2027-03-15T02:30:00-04:00", None),
                ("2027-03-16T06:30:00Z", "2027-03-16T02:30:00-04:00", None),
            ],
            id="spring-forward",
        ),
        pytest.param(
            "30 1 * * *",
            "2027-11-06T12:00:00Z",
            [
                ("2027-11-07T05:30:00Z", "2027-11-07T01:30:00-04:00",  # 01:30 happens twice: first pass only
                 "first pass of the repeated 01:30; a fixed-time expression does not fire in the second"),
                ("2027-11-08T06:30:00Z", "2027-11-08T01:30:00-05:00", None),
                ("2027-11-09T06:30:00Z", "2027-11-09T01:30:00-05:00", None),
            ],
            id="fall-back",
        ),
    ],
)
def test_preview_follows_vixie_cron_across_dst(
    capsys: pytest.CaptureFixture[str], no_daemon: None, expression: str, after: str, expected: list[tuple[str, str]]
) -> None:
    code, out, err = run(
        capsys,
        "jobs",
        "preview",
        "--cron",
        expression,
        "--tz",
        "America/New_York",
        "--after",
        after,
        "--count",
        "3",
        "--json",
    )

    assert (code, err) == (0, "")
    assert orjson.loads(out) == [{"utc": utc, "local": local, "note": note} for utc, local, note in expected]


def test_preview_prints_a_table_of_utc_and_local_times(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    code, out, _ = run(
        capsys, "jobs", "preview", "--cron", "30 2 * * *", "--tz", "America/New_York",
        "--after", "2027-03-13T12:00:00Z", "--count", "2",
    )  # fmt: skip

    assert code == 0
    header, moved, ordinary = out.splitlines()
    assert header.split() == ["UTC", "LOCAL", "(America/New_York)", "NOTE"]
    assert moved.startswith("2027-03-14T07:00:00Z  2027-03-14T03:00:00-04:00  moved: its time fell in the gap")
    assert ordinary.split() == ["2027-03-15T06:30:00Z", "2027-03-15T02:30:00-04:00", "-"]


def test_preview_accepts_every_and_at(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    code, out, _ = run(
        capsys, "jobs", "preview", "--every", "90", "--anchor", "2027-01-01T00:00:00Z",
        "--after", "2027-01-01T00:02:00Z", "--count", "2", "--tz", "Europe/Paris", "--json",
    )  # fmt: skip
    assert code == 0
    assert orjson.loads(out) == [
        {"utc": "2027-01-01T00:03:00Z", "local": "2027-01-01T01:03:00+01:00", "note": None},
        {"utc": "2027-01-01T00:04:30Z", "local": "2027-01-01T01:04:30+01:00", "note": None},
    ]

    code, out, _ = run(
        capsys, "jobs", "preview", "--at", "2027-06-01T10:00:00+02:00", "--after", "2027-01-01T00:00:00Z", "--json"
    )
    assert code == 0
    assert orjson.loads(out) == [{"utc": "2027-06-01T08:00:00Z", "local": "2027-06-01T08:00:00+00:00", "note": None}]


def test_an_abbreviated_time_zone_is_rejected_naming_it(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    code, out, err = run(capsys, "jobs", "preview", "--cron", "0 3 * * *", "--tz", "EST", "--count", "3", "--json")

    assert code == 1
    assert out == ""
    assert err.startswith("error: ")
    assert "'EST'" in err and "America/New_York" in err
    assert "Traceback" not in err


def test_create_validates_the_zone_before_connecting(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", "--cron", "0 3 * * *", "--tz", "EST")

    assert code == 1
    assert "'EST'" in err


def test_create_warns_when_at_is_in_the_past(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    with pytest.raises(AssertionError, match="tried to reach a daemon"):  # the warning comes first
        main(["jobs", "create", "--name", "n", "--type", "t", "--at", "2020-01-01T00:00:00Z"])
    err = capsys.readouterr().err
    assert "warning: --at 2020-01-01T00:00:00Z is in the past" in err and "catch-up" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--cron", "0 25 * * *"), "hour"),
        (("--at", "tomorrow"), "--at"),
        (("--every", "0.01"), "every"),
    ],
)
def test_bad_schedules_are_rejected_locally(
    capsys: pytest.CaptureFixture[str], no_daemon: None, flags: tuple[str, ...], named: str
) -> None:
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", *flags)

    assert code == 1
    assert err.startswith("error: ") and named in err


# -- jobs create -------------------------------------------------------------------------------


def test_invalid_payload_json_is_rejected_before_any_network_call(
    capsys: pytest.CaptureFixture[str], no_daemon: None
) -> None:
    code, out, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", "--now", "--payload", "{not json")

    assert code == 1
    assert out == ""
    assert err.startswith("error: --payload: is not valid JSON")


def test_a_payload_file_that_is_not_json_or_cannot_be_read_is_named(
    capsys: pytest.CaptureFixture[str], no_daemon: None, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", "--now", "--payload-file", str(broken))
    assert (code, err.startswith("error: --payload-file: is not valid JSON")) == (1, True)
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", "--now",
                       "--payload-file", str(tmp_path / "missing.json"))
    assert code == 1 and err.startswith("error: --payload-file: cannot be read: No such file or directory")


def test_payload_and_payload_file_go_alone(capsys: pytest.CaptureFixture[str], no_daemon: None, tmp_path: Path) -> None:
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", "--now", "--payload", "{}",
                       "--payload-file", str(tmp_path / "p.json"))
    assert code == 2 and "not allowed with argument" in err


def test_a_json_document_comes_from_its_text_a_file_or_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = orjson.dumps({"rows": ["x" * 100] * 2_000})  # 200 KiB: past what a command line holds
    path = tmp_path / "payload.json"
    path.write_bytes(big)
    assert json_document(None, str(path), flag="--payload", file_flag="--payload-file") == big
    assert json_document('{"id": 7}', None, flag="--payload", file_flag="--payload-file") == b'{"id": 7}'
    assert json_document(None, None, flag="--payload", file_flag="--payload-file") is None
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(big)))
    assert json_document("-", None, flag="--payload", file_flag="--payload-file") == big


def test_a_json_document_larger_than_any_node_takes_is_refused_without_reading_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arguments, "PAYLOAD_CEILING_BYTES", 1_000)
    path = tmp_path / "huge.json"
    path.write_bytes(b'"' + b"x" * 2_000 + b'"')
    with pytest.raises(InvalidArgument, match="--payload-file: is larger than"):
        json_document(None, str(path), flag="--payload", file_flag="--payload-file")


def test_a_workflow_input_file_is_read_and_checked_before_any_network_call(
    capsys: pytest.CaptureFixture[str], no_daemon: None, tmp_path: Path
) -> None:
    broken = tmp_path / "input.json"
    broken.write_text("[1,")
    code, _, err = run(capsys, "workflows", "trigger", "month-end", "--input-file", str(broken))
    assert code == 1 and err.startswith("error: --input-file: is not valid JSON")


def test_create_without_a_schedule_is_a_usage_error(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t")

    assert code == 2
    assert "usage: fastlane jobs create" in err
    assert "--now --at --cron --every" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("jobs", "create", "--name", "n", "--type", "t", "--now", "--cron", "* * * * *"),  # two schedules
        ("jobs", "create", "--name", "n", "--type", "t", "--every", "60", "--tz", "Europe/Paris"),
        ("jobs", "create", "--name", "n", "--type", "t", "--cron", "* * * * *", "--anchor", "2027-01-01T00:00:00Z"),
        ("jobs", "create", "--name", "n", "--type", "t", "--now", "--misfire", "sometimes"),
        ("jobs", "create", "--name", "n", "--type", "t", "--now", "--max-attempts", "0"),
        ("jobs", "preview", "--cron", "* * * * *", "--count", "many"),
        ("jobs",),
        ("bogus",),
        (),
    ],
)
def test_malformed_command_lines_are_usage_errors(
    capsys: pytest.CaptureFixture[str], no_daemon: None, argv: tuple[str, ...]
) -> None:
    code, out, err = run(capsys, *argv)

    assert code == 2
    assert out == ""
    assert "usage: fastlane" in err or "--help` lists its flags" in err


def test_flags_that_do_not_go_together_are_named_without_the_whole_usage(
    capsys: pytest.CaptureFixture[str], no_daemon: None
) -> None:
    code, _, err = run(capsys, "jobs", "create", "--name", "n", "--type", "t", "--every", "60", "--tz", "Europe/Paris")
    assert code == 2
    assert err == ("fastlane jobs create: error: --tz only goes with --cron (fire times of --at and --every do not "
                   "depend on a zone)\n(`fastlane jobs create --help` lists its flags)\n")


# -- help --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (("serve",), ("--db", "--listen", "--node-id", "--metrics", "--insecure", "--shards")),
        (("worker",), ("MODULE:ATTR", "--server", "--concurrency", "--realtime-priority")),
        (("migrate",), ("--db",)),
        (
            ("jobs", "create"),
            (
                "--name", "--type", "--now", "--at", "--cron", "--tz", "--every", "--anchor", "--payload",
                "--priority", "--max-attempts", "--misfire", "--overlap", "--delivery", "--timeout",
                "--lease-ttl", "--tenant", "--server", "--json",
            ),
        ),
        (("jobs", "list"), ("--state", "--type", "--limit", "--json", "--server", "--tenant")),
        (("jobs", "get"), ("JOB", "--json")),
        (("jobs", "trigger"), ("JOB", "--json")),
        (("jobs", "preview"), ("--cron", "--tz", "--after", "--count", "--every", "--at", "--json")),
        (("runs", "list"), ("--job", "--state", "--limit", "--json")),
        (("runs", "get"), ("RUN_ID", "--json")),
        (("cluster",), ("--json", "--server", "--tenant")),
    ],
)  # fmt: skip
def test_help_lists_the_flags_of_each_command(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...], flags: tuple[str, ...]
) -> None:
    code, out, _ = run(capsys, *command, "--help")

    assert code == 0
    assert f"usage: fastlane {' '.join(command)}" in out
    for flag in flags:
        assert flag in out


def test_every_flag_has_help_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "jobs", "create", "--help")

    assert code == 0
    # argparse prints a bare flag line with nothing after it only when help is missing, so every
    # line that starts with an option is followed by text on the same or the next line.
    lines = out.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("--") and "  " not in stripped:
            follower = lines[index + 1] if index + 1 < len(lines) else ""
            assert follower.startswith(" " * 10) and follower.strip(), f"no help for {stripped!r}"


# -- reaching the daemon -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("jobs", "list"),
        ("jobs", "get", "some-id"),
        ("runs", "list", "--state", "dead"),
        ("cluster",),
        ("jobs", "create", "--name", "n", "--type", "t", "--now", "--payload", '{"a": 1}'),
    ],
)
def test_an_unreachable_daemon_gets_a_friendly_message(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    server = f"127.0.0.1:{closed_port()}"

    code, out, err = run(capsys, *argv, "--server", server, "--rpc-timeout", "3")

    assert code == 1
    assert out == ""
    assert err.startswith(f"error: cannot reach the fastlane daemon at {server} — is `fastlane serve` running?")
    assert "Traceback" not in err


def test_the_server_defaults_to_fastlane_server_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("FASTLANE_SERVER", server)

    code, _, err = run(capsys, "jobs", "list", "--rpc-timeout", "3")

    assert code == 1
    assert f"daemon at {server}" in err


# -- daemon commands ---------------------------------------------------------------------------


def test_migrate_reports_the_schema_version(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/fastlane.db"

    code, out, _ = run(capsys, "migrate", "--db", url)

    assert code == 0
    assert out.startswith("schema at version ")
    assert out.strip().endswith(f"({url})")


def test_migrate_rejects_an_unknown_database(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "migrate", "--db", "mysql://localhost/x")

    assert code == 1
    assert err.startswith("error: unsupported database URL")


def test_serve_rejects_a_public_address_without_insecure(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "serve", "--listen", "0.0.0.0:7070")

    assert code == 1
    assert "--insecure" in err


def test_worker_target_must_name_module_and_attribute(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "worker", "myapp.tasks")

    assert code == 2
    assert "MODULE:ATTR" in err


# -- output ------------------------------------------------------------------------------------


def test_tables_align_columns_and_show_missing_values_as_dashes() -> None:
    table = format_table(("ID", "NAME", "ERROR"), [("1", "short", None), ("22", "a-longer-name", "boom")])

    assert table.splitlines() == [
        "ID  NAME           ERROR",
        "1   short          -",
        "22  a-longer-name  boom",
    ]


def test_fields_align_values() -> None:
    assert format_fields([("job_id", "j-1"), ("next_fire_at", None)]).splitlines() == [
        "job_id        j-1",
        "next_fire_at  -",
    ]


# -- entry points of other modules -------------------------------------------------------------


def test_serve_hands_the_settings_to_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[Settings] = []

    async def serve(settings: Settings, **_: object) -> int:  # the node may be a coroutine or a plain function
        received.append(settings)
        return 3

    monkeypatch.setitem(sys.modules, "fastlane.server.node", SimpleNamespace(serve=serve))

    code = main(["serve", "--db", "sqlite:///x.db", "--listen", "127.0.0.1:7171", "--node-id", "n1", "--shards", "8"])

    assert code == 3
    [settings] = received
    assert (settings.db_url, settings.listen, settings.node_id, settings.shard_count) == (
        "sqlite:///x.db",
        "127.0.0.1:7171",
        "n1",
        8,
    )
    assert (settings.metrics_listen, settings.insecure) == (None, False)


def test_serve_defaults_to_sqlite_in_the_working_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[Settings] = []
    monkeypatch.setitem(sys.modules, "fastlane.server.node", SimpleNamespace(serve=lambda s, **_: received.append(s) or 0))

    assert main(["serve"]) == 0
    assert (received[0].db_url, received[0].listen) == ("sqlite:///fastlane.db", "127.0.0.1:7070")


def test_worker_passes_only_the_overrides_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[str, list[str], int | None, str | None, object, int | None]] = []
    metrics: list[str | None] = []

    def run_worker_cli(target, servers, concurrency, *, token, tls, realtime_priority, **given):  # type: ignore[no-untyped-def]
        calls.append((target, servers, concurrency, token, tls, realtime_priority))
        metrics.append(given.get("metrics"))
        return 0

    fake = SimpleNamespace(run_worker_cli=run_worker_cli)
    monkeypatch.setitem(sys.modules, "fastlane.worker", fake)
    monkeypatch.delenv("FASTLANE_SERVER", raising=False)
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("fl_secret-from-file\n")

    assert main(["worker", "app.tasks:worker"]) == 0
    assert main(["worker", "app.tasks:worker", "--server", "a:1", "--server", "b:2", "--concurrency", "4"]) == 0
    monkeypatch.setenv("FASTLANE_SERVER", "env:3")
    assert main(["worker", "app.tasks:worker"]) == 0
    assert main(["worker", "app.tasks:worker", "--token-file", str(token_file), "--tls-ca", "ca.pem"]) == 0
    assert main(["worker", "app.tasks:worker", "--realtime-priority", "99"]) == 0
    assert main(["worker", "app.tasks:worker", "--realtime-priority", "0"]) == 0  # off, whatever the code says
    assert main(["worker", "app.tasks:worker", "--metrics", "127.0.0.1:9465"]) == 0

    assert calls == [
        ("app.tasks:worker", [], None, None, None, None),
        ("app.tasks:worker", ["a:1", "b:2"], 4, None, None, None),
        ("app.tasks:worker", ["env:3"], None, None, None, None),
        ("app.tasks:worker", ["env:3"], None, "fl_secret-from-file", ClientTls(ca_file=Path("ca.pem")), None),
        ("app.tasks:worker", ["env:3"], None, None, None, 99),
        ("app.tasks:worker", ["env:3"], None, None, None, 0),
        ("app.tasks:worker", ["env:3"], None, None, None, None),
    ]
    assert metrics == [None] * 6 + ["127.0.0.1:9465"]


def test_fastlane_server_may_name_several_nodes(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []
    fake = SimpleNamespace(run_worker_cli=lambda target, servers, *args, **kwargs: calls.append(servers) or 0)
    monkeypatch.setitem(sys.modules, "fastlane.worker", fake)
    monkeypatch.setenv("FASTLANE_SERVER", "node-0:7070, node-1 ,")
    assert main(["worker", "app.tasks:worker"]) == 0
    assert calls == [["node-0:7070", "node-1:7070"]]  # each one, a bare host on the default port
    assert arguments.default_server() == "node-0:7070"  # a client command calls the first
    monkeypatch.setenv("FASTLANE_SERVER", "node-0:7070,node-1:99999")
    assert main(["worker", "app.tasks:worker"]) == 1
    assert capsys.readouterr().err.startswith("error: $FASTLANE_SERVER: 'node-1:99999' is not HOST:PORT")


@pytest.mark.parametrize("value", ["100", "-1", "1.5", "x", ""])
def test_worker_refuses_a_realtime_priority_outside_0_to_99(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "app.tasks:worker", "--realtime-priority", value]) == 2
    assert "--realtime-priority" in capsys.readouterr().err


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://fastlane:s3cret@db:5432/fastlane", "postgresql://fastlane:***@db:5432/fastlane"),
    # Several hosts (a primary and its standbys) have no single port for urllib to parse.
    ("postgresql://fastlane:s3cret@pg-0:5432,pg-1:5432/fastlane?target_session_attrs=read-write",
     "postgresql://fastlane:***@pg-0:5432,pg-1:5432/fastlane?target_session_attrs=read-write"),
    ("postgresql://fastlane@pg-0,pg-1/fastlane", "postgresql://fastlane@pg-0,pg-1/fastlane"),
    ("sqlite:///var/lib/fastlane.db", "sqlite:///var/lib/fastlane.db"),
])
def test_database_urls_are_logged_without_their_password(url, shown):
    assert redacted_url(url) == shown


def test_serve_takes_tenant_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[Settings] = []

    async def serve(settings: Settings, **_: object) -> int:
        received.append(settings)
        return 0

    monkeypatch.setitem(sys.modules, "fastlane.server.node", SimpleNamespace(serve=serve))
    assert main(["serve", "--db", "sqlite:///x.db", "--tenant-weight", "billing=3", "--tenant-weight", "ops=1",
                 "--tenant-max-in-flight", "billing=40", "--priority-reserve=-5=3", "--max-backlog", "2500",
                 "--max-backlog-seconds", "0.5"]) == 0
    assert received[0].tenant_weights == {"billing": 3, "ops": 1}
    assert received[0].max_backlog == 2500
    assert received[0].max_backlog_seconds == 0.5
    assert received[0].tenant_max_in_flight == {"billing": 40}
    assert received[0].priority_reserve == PriorityReserve(priority=-5, credits=3)


@pytest.mark.parametrize("value", ["billing", "billing=0", "billing=101", "billing=x", "=3", "bad tenant=2"])
def test_serve_refuses_a_tenant_weight_out_of_bounds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--tenant-weight", value]) == 2
    assert "--tenant-weight" in capsys.readouterr().err


@pytest.mark.parametrize("weight", [0, 101])
def test_settings_refuse_a_tenant_weight_out_of_bounds(weight: int) -> None:
    with pytest.raises(ConfigurationError, match="--tenant-weight"):
        Settings(tenant_weights={"billing": weight})


@pytest.mark.parametrize("value", ["billing", "billing=0", "billing=1000001", "billing=x", "bad tenant=2"])
def test_serve_refuses_a_tenant_cap_out_of_bounds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--tenant-max-in-flight", value]) == 2
    assert "--tenant-max-in-flight" in capsys.readouterr().err


@pytest.mark.parametrize("cap", [0, 1_000_001])
def test_settings_refuse_a_tenant_cap_out_of_bounds(cap: int) -> None:
    with pytest.raises(ConfigurationError, match="--tenant-max-in-flight"):
        Settings(tenant_max_in_flight={"billing": cap})


@pytest.mark.parametrize("value", ["0", "-5", "x", "10000001"])
def test_serve_refuses_a_backlog_bound_out_of_range(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-backlog", value]) == 2
    assert "--max-backlog" in capsys.readouterr().err


@pytest.mark.parametrize("bound", [0, 10_000_001])
def test_settings_refuse_a_backlog_bound_out_of_range(bound: int) -> None:
    with pytest.raises(ConfigurationError, match="--max-backlog"):
        Settings(max_backlog=bound)


@pytest.mark.parametrize("value", ["-0.5", "x", "3600.5", "nan", "inf"])
def test_serve_refuses_backlog_seconds_out_of_range(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-backlog-seconds", value]) == 2
    assert "--max-backlog-seconds" in capsys.readouterr().err


@pytest.mark.parametrize("seconds", [-1.0, 3_600.5, math.nan, math.inf])
def test_settings_refuse_backlog_seconds_out_of_range(seconds: float) -> None:
    with pytest.raises(ConfigurationError, match="--max-backlog-seconds"):
        Settings(max_backlog_seconds=seconds)


def test_serve_backlog_seconds_default_and_zero() -> None:
    assert Settings().max_backlog_seconds == 2.0
    assert Settings(max_backlog_seconds=0).max_backlog_seconds == 0


@pytest.mark.parametrize("value", ["100", "100=0", "100=100001", "x=3", "1001=3", "-1001=3", "100=x", "=3"])
def test_serve_refuses_a_priority_reserve_out_of_bounds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--priority-reserve", value]) == 2
    assert "--priority-reserve" in capsys.readouterr().err


@pytest.mark.parametrize(("priority", "credits"), [(1001, 1), (-1001, 1), (0, 0), (0, 100_001)])
def test_settings_refuse_a_priority_reserve_out_of_bounds(priority: int, credits: int) -> None:
    with pytest.raises(ConfigurationError, match="--priority-reserve"):
        Settings(priority_reserve=PriorityReserve(priority, credits))



def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fastlane {version('fastlane')}"


@pytest.mark.parametrize(("given", "dialled"), [
    ("localhost", "localhost:7070"), ("10.0.0.7", "10.0.0.7:7070"), ("node-2:7171", "node-2:7171"),
    ("::1", "[::1]:7070"), ("[::1]", "[::1]:7070"), ("[::1]:9000", "[::1]:9000"), ("dns:///fastlane:7070", "dns:///fastlane:7070"),
    ("ipv4:10.0.0.1:7070", "ipv4:10.0.0.1:7070"), ("unix-abstract:fastlane", "unix-abstract:fastlane"),
])
def test_a_server_given_without_a_port_is_dialled_on_7070(given: str, dialled: str) -> None:
    from fastlane.cli.arguments import server_address

    assert server_address(given) == dialled


@pytest.mark.parametrize("given", ["node:https", "node:0", "node:70000", "[::1]x"])
def test_a_server_with_a_bad_port_is_refused(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "list", "--server", given]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err


def test_serve_and_worker_take_a_log_format(monkeypatch: pytest.MonkeyPatch) -> None:
    formats: list[object] = []

    async def serve(settings: Settings, *, log_format: str | None = None) -> int:
        formats.append(log_format)
        return 0

    monkeypatch.setitem(sys.modules, "fastlane.server.node", SimpleNamespace(serve=serve))
    assert main(["serve", "--db", "sqlite:///x.db", "--log-format", "json"]) == 0
    assert main(["serve", "--db", "sqlite:///x.db"]) == 0
    assert formats == ["json", None]
    assert main(["worker", "x:y", "--log-format", "yaml"]) == 2


@pytest.mark.parametrize(("flag", "retention"), [
    ([], timedelta(days=30)),
    (["--history-retention", "0.5"], timedelta(hours=12)),
    (["--history-retention", "0"], None),
])
def test_serve_takes_a_history_retention_in_days(
    monkeypatch: pytest.MonkeyPatch, flag: list[str], retention: timedelta | None
) -> None:
    received: list[Settings] = []

    async def serve(settings: Settings, **_: object) -> int:
        received.append(settings)
        return 0

    monkeypatch.setitem(sys.modules, "fastlane.server.node", SimpleNamespace(serve=serve))
    assert main(["serve", "--db", "sqlite:///x.db", *flag]) == 0
    assert received[0].history_retention == retention


@pytest.mark.parametrize("value", ["0.04", "-1", "36601", "nan", "inf", "month"])
def test_serve_refuses_a_history_retention_out_of_bounds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--history-retention", value]) == 2
    assert "--history-retention" in capsys.readouterr().err


@pytest.mark.parametrize("retention", [timedelta(minutes=59), timedelta(0), timedelta(days=36601)])
def test_settings_refuse_a_history_retention_out_of_bounds(retention: timedelta) -> None:
    with pytest.raises(ConfigurationError, match="--history-retention"):
        Settings(history_retention=retention)


def test_output_cut_short_by_its_reader_ends_quietly(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``fastlane jobs preview ... | head -1``: the reader goes away, and no traceback follows."""

    class GoneReader(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", GoneReader())
    code = main(["jobs", "preview", "--cron", "* * * * *", "--count", "1000"])
    assert code == 141  # as a process ended by SIGPIPE
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("90s", 90.0), ("1.5m", 90.0), ("2h", 7200.0), ("1d", 86_400.0), ("250ms", 0.25), (" 15M ", 900.0),
    ("1h30m", 5400.0), ("2d12h", 216_000.0), ("1m30s500ms", 90.5),
])
def test_every_duration_is_written_one_way(text: str, seconds: float) -> None:
    assert arguments.duration_seconds(text) == seconds
    assert arguments.positive_seconds(text) == seconds
    if seconds >= 1:  # a token lives a second at least
        assert arguments.lifetime(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "m", "90x", "ninety", "nan", "inf", "1e400", "-5m", "0", "0s", "1e20", "1e12d",
                                  "1h30", "1h 30m", "h30m", "1e3s"])
def test_a_duration_that_is_none_is_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        arguments.positive_seconds(text)


def test_every_and_expires_take_the_same_durations(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    code, out, _ = run(capsys, "jobs", "preview", "--every", "15m", "--after", "2026-06-01T00:00:00Z", "--count", "2",
                       "--json")
    assert code == 0
    fires = [row["utc"] for row in orjson.loads(out)]
    assert fires == ["2026-06-01T00:15:00Z", "2026-06-01T00:30:00Z"]
    assert arguments.lifetime("3600") == arguments.lifetime("60m") == timedelta(hours=1)  # a bare number: seconds
    assert arguments.seconds_up_to(60)("1m") == 60.0  # and the bounded ones, as --max-backlog-seconds
    with pytest.raises(argparse.ArgumentTypeError, match="out of range"):
        arguments.seconds_up_to(60)("2m")
    with pytest.raises(argparse.ArgumentTypeError):
        arguments.lifetime("1e20")  # past a century: refused, not a traceback


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                found += [((*path, name), command), *_commands(command, (*path, name))]
    return found


def test_every_command_says_what_it_does_in_plain_text() -> None:
    from fastlane.cli.main import build_parser

    commands = _commands(build_parser())
    assert len(commands) > 30
    for path, command in commands:
        text = command.format_help()
        assert command.description, f"fastlane {' '.join(path)} --help has no description"
        assert "``" not in text and ":mod:`" not in text and ":func:`" not in text, f"markup in {path}: {text[:300]}"


def test_runs_list_since_and_until_take_an_instant_or_a_duration_ago(
    capsys: pytest.CaptureFixture[str], no_daemon: None
) -> None:
    from datetime import UTC, datetime

    from fastlane.cli.run_selection import when as _when

    before = datetime.now(UTC)
    two_hours_ago = _when("2h")
    assert before - timedelta(hours=2, seconds=1) <= two_hours_ago <= datetime.now(UTC) - timedelta(hours=2)
    assert _when("2026-06-01T00:00:00Z") == datetime(2026, 6, 1, tzinfo=UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="neither an RFC 3339 instant"):
        _when("yesterday")
    code, _, err = run(capsys, "runs", "list", "--since", "1h", "--until", "2h")  # until two hours ago: before since
    assert code == 2 and "--until must be later than --since" in err


@pytest.mark.parametrize(("argv", "said"), [
    (("runs", "cancel"), "give a RUN_ID, or select runs with --job"),
    (("runs", "retry", "0d43aa", "--type", "billing"), "a RUN_ID or a selection"),
    (("runs", "retry", "0d43aa", "--yes"), "--dry-run, --yes and --limit go with a selection"),
    (("runs", "cancel", "--type", "billing", "--since", "1h", "--until", "2h"), "--until must be later than --since"),
    (("jobs", "pause"), "give a JOB, or select jobs with --type or --state"),
    (("jobs", "delete", "nightly", "--type", "billing"), "a JOB or a selection"),
    (("jobs", "resume", "nightly", "--dry-run"), "--dry-run, --yes and --limit go with a selection, not a JOB"),
    (("jobs", "pause", "--state", "paused"), "invalid choice: 'paused'"),  # a pause takes active jobs only
])
def test_a_bulk_action_wants_one_run_or_job_or_a_selection_and_says_which_before_reaching_a_node(
    capsys: pytest.CaptureFixture[str], no_daemon: None, argv: tuple[str, ...], said: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and said in err


def test_a_tail_row_with_a_long_job_name_stays_in_its_columns() -> None:
    from fastlane.cli.runs import RUN_COLUMNS, tail_line

    header = tail_line(RUN_COLUMNS)
    long_name = "a-very-very-long-job-name-that-exceeds-forty-characters"
    row = tail_line(["0778b5e0-8c1d-4f7e-9a55-5a3f0d2b9c11", long_name, "succeeded", "2026-12-03T12:07:09.930345Z",
                     "0.1 ms", "-", "1", "-", "-"])
    starts = [header.index(title) for title in ("STATE", "SCHEDULED_FOR", "LAG", "DURATION")]
    assert all(row[start - 2:start] == "  " and row[start] != " " for start in starts), row
    assert "a-very-very-long-jo…" in row and long_name not in row


def test_the_flags_in_milliseconds_or_days_take_durations_too_and_output_is_written_as_input() -> None:
    # A bare number keeps the flag's own unit; a number with a unit means what it does everywhere.
    assert arguments.milliseconds_up_to(1000)("300") == arguments.milliseconds_up_to(1000)("0.3s") == 300.0
    assert arguments.positive_milliseconds("500") == arguments.positive_milliseconds("0.5s") == 500.0
    assert arguments.history_retention_days("30") == arguments.history_retention_days("30d") == 30.0
    assert arguments.history_retention_days("36h") == 1.5
    with pytest.raises(argparse.ArgumentTypeError, match="out of range"):
        arguments.milliseconds_up_to(1000)("2s")
    from fastlane.cli.views import format_seconds

    for seconds in (5400, 90, 1.5, 0.5, 30, 86_400.5, 300):
        shown = format_seconds(timedelta(seconds=seconds))
        assert shown is not None and arguments.duration_seconds(shown) == seconds, shown
    assert format_seconds(timedelta(seconds=5400)) == "1h30m"
