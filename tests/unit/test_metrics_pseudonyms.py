"""/metrics names no tenant and no job type unless told to (issue S3: a scrape, which takes no
token, listed every tenant and job type): pseudonyms stand in for them, stable for a secret."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client import generate_latest

from fastlane.runtime.metrics import OTHER, Metrics, Pseudonyms, QueueLabels
from fastlane.testing.processes import free_port

PSEUDONYM = re.compile(r'(tenant|job_type)="([^"]*)"')


def metrics_with_names() -> Metrics:
    metrics = Metrics()
    metrics.unserved.read = lambda: {("payroll.run", "acme"): 3}
    metrics.ready_by_tenant.read = lambda: {("payroll.run", "acme"): 5, ("mail.send", "globex"): 1}
    metrics.held_by_cap.read = lambda: {("payroll.run", "acme", "tenant_in_flight"): 2}
    metrics.worker_streams.read = lambda: {("payroll.run",): 1}
    return metrics


def test_the_exposed_metrics_carry_pseudonyms_not_names():
    text = generate_latest(metrics_with_names().exposed(secret=b"dsn")).decode()
    for name in ("acme", "globex", "payroll.run", "mail.send"):
        assert name not in text
    values = PSEUDONYM.findall(text)
    assert values and all(re.fullmatch(r"t-[0-9a-f]{10}" if label == "tenant" else r"j-[0-9a-f]{10}", value)
                          for label, value in values)
    pseudonyms = Pseudonyms(b"dsn")
    assert f'fastlane_unserved_runs{{job_type="{pseudonyms.of("job_type", "payroll.run")}",' \
           f'tenant="{pseudonyms.of("tenant", "acme")}"}} 3.0' in text
    assert 'cap="tenant_in_flight"' in text  # other labels as they were


def test_pseudonyms_are_stable_for_a_secret_and_differ_between_secrets():
    assert Pseudonyms(b"one").of("tenant", "acme") == Pseudonyms(b"one").of("tenant", "acme")
    assert Pseudonyms(b"one").of("tenant", "acme") != Pseudonyms(b"two").of("tenant", "acme")
    assert Pseudonyms(b"one").of("tenant", "acme") != Pseudonyms(b"one").of("tenant", "acmf")
    assert Pseudonyms(b"one").of("tenant", "") == ""  # a worker serving every tenant


def test_names_in_clear_when_asked_and_the_registry_keeps_them():
    metrics = metrics_with_names()
    assert 'tenant="acme"' in generate_latest(metrics.exposed(names_in_clear=True)).decode()
    assert metrics.registry.get_sample_value("fastlane_unserved_runs", {"job_type": "payroll.run",
                                                                        "tenant": "acme"}) == 3


def test_a_scrape_of_a_node_given_no_choice_names_nothing():
    metrics = metrics_with_names()
    address = f"127.0.0.1:{free_port()}"
    metrics.serve(address)  # as a node serves it without being told its settings: the safe default
    with urllib.request.urlopen(f"http://{address}/metrics?name[]=fastlane_unserved_runs", timeout=5) as response:
        text = response.read().decode()
    assert "fastlane_unserved_runs{" in text and "acme" not in text and "payroll.run" not in text
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        everything = response.read().decode()
    assert "fastlane_runs_total" in everything and "_created" not in everything  # no doubled series


def test_series_by_job_type_and_tenant_are_bounded_and_the_rest_counted_as_other():
    labels = QueueLabels(most=3)
    named = [("billing", "acme"), ("reports", "acme"), ("billing", "globex")]
    assert [labels.of(queue) for queue in named] == named
    assert labels.of(("fourth", "acme")) == (OTHER, OTHER)
    assert labels.of(("billing", "acme")) == ("billing", "acme")  # the first ones keep their names
    # The catch-all is the same in the pseudonymised view: an operator can tell it from a name.
    pseudonyms = Pseudonyms(b"secret")
    assert pseudonyms.labels({"job_type": OTHER, "tenant": OTHER}) == {"job_type": OTHER, "tenant": OTHER}
    assert pseudonyms.of("job_type", "billing").startswith("j-")
