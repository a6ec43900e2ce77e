"""The deployment files under deploy/: Kubernetes manifests that the API server would accept and
that are wired the way a fastlane node needs, and an image that runs fastlane unprivileged.

Schemas come from kubernetes-validate, which bundles them: the checks run offline. Strict mode,
so a misspelt or misplaced field fails instead of being silently dropped by the API server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from fastlane.cli.main import main
from fastlane.config import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"

# The oldest Kubernetes release the manifests must work on; kubernetes-validate bundles its schemas.
KUBERNETES_VERSION = "1.30.0"
NAMESPACE = "fastlane"
KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
# Files that `kubectl apply -k` must not apply.
NOT_FOR_PRODUCTION = {"dev-postgres.yaml", "secret.example.yaml"}
CLUSTER_SCOPED = {"Namespace"}
POD_NAME = "fastlane-1"
SAMPLE_DSN = "postgresql://fastlane:s3cret@db.example.internal:5432/fastlane"


# -- loading ---------------------------------------------------------------------------------------


def _load_documents() -> list[tuple[Path, dict[str, Any]]]:
    documents = []
    for path in sorted(MANIFESTS.rglob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                documents.append((path, document))
    return documents


DOCUMENTS = _load_documents()
KUBERNETES_OBJECTS = [(path, doc) for path, doc in DOCUMENTS if doc.get("apiVersion") != KUSTOMIZE_API]


def _document_id(entry: tuple[Path, dict[str, Any]]) -> str:
    path, document = entry
    name = (document.get("metadata") or {}).get("name", "?")
    return f"{path.relative_to(MANIFESTS)}:{document.get('kind', '?')}/{name}"


def find(kind: str, name: str, file: str | None = None) -> dict[str, Any]:
    """The one document of ``kind`` called ``name`` (in ``file``, if given)."""
    found = [
        doc for path, doc in KUBERNETES_OBJECTS
        if doc.get("kind") == kind and doc["metadata"].get("name") == name and (file is None or path.name == file)
    ]
    assert len(found) == 1, f"expected exactly one {kind} {name!r} under {MANIFESTS}, found {len(found)}"
    return found[0]


@cache
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())


def statefulset() -> dict[str, Any]:
    return find("StatefulSet", "fastlane", "statefulset.yaml")


def pod_spec() -> dict[str, Any]:
    return statefulset()["spec"]["template"]["spec"]


def pod_labels() -> dict[str, str]:
    return statefulset()["spec"]["template"]["metadata"]["labels"]


def container() -> dict[str, Any]:
    containers = pod_spec()["containers"]
    assert [c["name"] for c in containers] == ["fastlane"], "the fastlane pod runs one container, `fastlane`"
    return containers[0]


def container_port(name: str) -> int:
    ports = {port["name"]: port["containerPort"] for port in container().get("ports", [])}
    assert name in ports, f"the fastlane container declares no port named {name!r}: {ports}"
    return ports[name]


def env_var(name: str) -> dict[str, Any]:
    entries = [entry for entry in container().get("env", []) if entry["name"] == name]
    assert len(entries) == 1, f"the fastlane container must set {name} exactly once"
    return entries[0]


def flag_value(args: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag VALUE`` or ``--flag=VALUE``), else None."""
    for index, arg in enumerate(args):
        if arg == flag:
            return args[index + 1] if index + 1 < len(args) else None
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity as a number (cores, bytes)."""
    text = str(value)
    binary = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    decimal = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for suffix, factor in binary.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    if text[-1:] in decimal:
        return float(text[:-1]) * decimal[text[-1]]
    return float(text)


def pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    for entry in KUBERNETES_OBJECTS:
        _, document = entry
        if document["kind"] in {"StatefulSet", "Deployment", "DaemonSet", "Job"}:
            yield _document_id(entry), document["spec"]["template"]["spec"]


# -- every manifest is a valid Kubernetes object ---------------------------------------------------


def test_manifests_found() -> None:
    kinds = {doc["kind"] for _, doc in KUBERNETES_OBJECTS}
    assert {"Namespace", "StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "Secret"} <= kinds


@pytest.mark.parametrize("entry", KUBERNETES_OBJECTS, ids=[_document_id(e) for e in KUBERNETES_OBJECTS])
def test_manifest_matches_kubernetes_schema(entry: tuple[Path, dict[str, Any]]) -> None:
    _, document = entry
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(part) for part in error.path) or "(top level)"
        pytest.fail(f"{where}: {error.message}")
    except kubernetes_validate.SchemaNotFoundError as error:
        pytest.fail(error.message)


def test_only_the_kustomization_is_not_a_kubernetes_object() -> None:
    others = [_document_id(e) for e in DOCUMENTS if e[1].get("apiVersion") == KUSTOMIZE_API]
    assert others == ["kustomization.yaml:Kustomization/?"]


@pytest.mark.parametrize("entry", KUBERNETES_OBJECTS, ids=[_document_id(e) for e in KUBERNETES_OBJECTS])
def test_namespaced_objects_live_in_the_fastlane_namespace(entry: tuple[Path, dict[str, Any]]) -> None:
    _, document = entry
    namespace = document["metadata"].get("namespace")
    if document["kind"] in CLUSTER_SCOPED:
        assert namespace is None
    else:
        assert namespace == NAMESPACE


def test_kustomization_applies_every_production_file_and_nothing_else() -> None:
    listed = kustomization()["resources"]
    production = sorted(
        path.name for path in MANIFESTS.glob("*.yaml") if path.name not in NOT_FOR_PRODUCTION | {"kustomization.yaml"}
    )
    assert sorted(listed) == production
    assert not NOT_FOR_PRODUCTION & set(listed)


def test_kustomization_image_entry_names_the_container_image() -> None:
    names = [image["name"] for image in kustomization().get("images", [])]
    assert names == [container()["image"].rsplit(":", 1)[0]]


# -- the StatefulSet runs fastlane nodes the way they need --------------------------------------


def test_statefulset_governing_service_is_the_headless_service() -> None:
    spec = statefulset()["spec"]
    headless = find("Service", spec["serviceName"])
    assert headless["metadata"]["name"] == "fastlane-headless"
    assert headless["spec"]["clusterIP"] == "None"
    # Nodes must find each other (and be found by workers) before they report ready.
    assert headless["spec"].get("publishNotReadyAddresses") is True
    assert selects(headless["spec"]["selector"], pod_labels())


def test_statefulset_shape() -> None:
    spec = statefulset()["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"
    assert selects(spec["selector"]["matchLabels"], pod_labels())


def test_node_id_is_the_pod_name() -> None:
    node_id = env_var("FASTLANE_NODE_ID")
    assert node_id.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
    # A --node-id flag would override the variable.
    assert flag_value(container()["args"], "--node-id") is None


def test_dsn_comes_from_a_secret() -> None:
    reference = env_var("FASTLANE_DB").get("valueFrom", {}).get("secretKeyRef")
    assert reference == {"name": "fastlane-db", "key": "dsn"}
    # fastlane serve reads $FASTLANE_DB itself: a --db flag would put the password in the process list.
    assert flag_value(container()["args"], "--db") is None
    # The example Secret documents the same name and key.
    example = find("Secret", "fastlane-db", "secret.example.yaml")
    assert set(example["stringData"]) == {"dsn"}


def test_no_credentials_in_the_statefulset() -> None:
    text = (MANIFESTS / "statefulset.yaml").read_text()
    assert "postgresql://" not in text and "postgres://" not in text


def test_variable_references_are_defined() -> None:
    """Kubernetes leaves an undefined $(VAR) as it is, so a typo would reach fastlane verbatim."""
    defined: list[str] = []
    for entry in container()["env"]:
        for reference in re.findall(r"\$\((\w+)\)", entry.get("value", "")):
            assert reference in defined, f"{entry['name']} refers to {reference}, not defined before it"
        defined.append(entry["name"])
    for arg in container().get("command", []) + container()["args"]:
        for reference in re.findall(r"\$\((\w+)\)", arg):
            assert reference in defined, f"argument {arg!r} refers to undefined {reference}"


def _pod_environment() -> dict[str, str]:
    """The container's environment as Kubernetes would build it for pod POD_NAME."""
    environment: dict[str, str] = {}
    for entry in container()["env"]:
        source = entry.get("valueFrom", {})
        if source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            environment[entry["name"]] = POD_NAME
        elif "secretKeyRef" in source:
            environment[entry["name"]] = SAMPLE_DSN
        elif "value" in entry:
            environment[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: environment[m.group(1)], entry["value"])
        else:
            raise AssertionError(f"no sample value for {entry}")
    return environment


def test_fastlane_serve_accepts_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real command line parses the container's arguments into the intended settings."""
    environment = _pod_environment()
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    argv = [re.sub(r"\$\((\w+)\)", lambda m: environment[m.group(1)], arg) for arg in container()["args"]]
    captured: list[Settings] = []

    def fake_serve(settings: Settings) -> int:
        captured.append(settings)
        return 0

    monkeypatch.setattr("fastlane.server.node.serve", fake_serve)  # the function `fastlane serve` runs
    assert main(argv) == 0, f"fastlane {' '.join(argv)} was refused"
    [settings] = captured
    assert settings.db_url == SAMPLE_DSN
    assert settings.node_id == POD_NAME
    # Reachable from other pods: which needs --insecure until fastlane has authentication.
    assert settings.listen == f"0.0.0.0:{container_port('grpc')}"
    assert settings.insecure is True
    assert settings.metrics_listen == f"0.0.0.0:{container_port('metrics')}"
    assert settings.advertised_address == f"{POD_NAME}.fastlane-headless.{NAMESPACE}.svc.cluster.local:7070"


def test_advertised_address_is_the_pods_stable_dns_name() -> None:
    assert env_var("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    service = statefulset()["spec"]["serviceName"]
    expected = f"$(POD_NAME).{service}.{NAMESPACE}.svc.cluster.local:{container_port('grpc')}"
    assert flag_value(container()["args"], "--advertise") == expected


@pytest.mark.parametrize("probe", ["readinessProbe", "livenessProbe", "startupProbe"])
def test_probe_uses_grpc_health_on_the_grpc_port(probe: str) -> None:
    assert probe in container(), f"the fastlane container has no {probe}"
    check = container()[probe]
    assert set(check) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}
    assert check["grpc"]["port"] == container_port("grpc") == 7070
    # Service "" is the node as a whole: SERVING once its window is loaded.
    assert check["grpc"].get("service", "") == ""


def test_liveness_is_more_patient_than_readiness() -> None:
    def patience(probe: dict[str, Any]) -> int:
        return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)

    liveness, readiness = container()["livenessProbe"], container()["readinessProbe"]
    assert liveness.get("failureThreshold", 3) >= 3
    assert patience(liveness) >= 30
    assert patience(liveness) > patience(readiness)


def test_shutdown_has_time_to_hand_shards_over() -> None:
    # SIGTERM: not ready, stop firing, flush results, release shards: up to about 10 s.
    assert pod_spec().get("terminationGracePeriodSeconds", 30) >= 20
    # Kubernetes sends SIGTERM unless a preStop hook or a command wrapper gets in the way.
    assert "command" not in container()
    assert "preStop" not in container().get("lifecycle", {})


def test_resources_have_requests_and_limits() -> None:
    resources = container()["resources"]
    for resource in ("cpu", "memory"):
        request, limit = resources["requests"][resource], resources["limits"][resource]
        assert 0 < quantity(request) <= quantity(limit), f"{resource}: request {request}, limit {limit}"


def test_container_is_locked_down() -> None:
    pod_context, context = pod_spec()["securityContext"], container()["securityContext"]
    assert pod_context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert not context["capabilities"].get("add")
    assert pod_spec().get("automountServiceAccountToken") is False
    # The uid runAsNonRoot checks is the image's own user.
    assert pod_context.get("runAsUser", dockerfile_uid()) == dockerfile_uid()


def test_root_filesystem_is_read_only_but_tmp_is_writable() -> None:
    mounts = {mount["mountPath"]: mount["name"] for mount in container().get("volumeMounts", [])}
    assert "/tmp" in mounts
    volumes = {volume["name"]: volume for volume in pod_spec().get("volumes", [])}
    assert "emptyDir" in volumes[mounts["/tmp"]]


@pytest.mark.parametrize("template", [spec for _, spec in pod_templates()], ids=[name for name, _ in pod_templates()])
def test_pods_meet_the_restricted_pod_security_standard(template: dict[str, Any]) -> None:
    """namespace.yaml enforces "restricted": a pod that does not meet it is never created."""
    namespace = find("Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod_context = template.get("securityContext", {})
    for each in template["containers"] + template.get("initContainers", []):
        context = each.get("securityContext", {})
        assert context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True, each["name"]
        assert context.get("runAsUser", pod_context.get("runAsUser")) != 0, each["name"]
        assert context.get("allowPrivilegeEscalation") is False, each["name"]
        assert "ALL" in context.get("capabilities", {}).get("drop", []), each["name"]
        assert set(context.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}, each["name"]
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        assert seccomp.get("type") in {"RuntimeDefault", "Localhost"}, each["name"]
        assert not context.get("privileged"), each["name"]


def test_nodes_are_spread_over_machines() -> None:
    terms = pod_spec()["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        and selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], pod_labels())
        for term in terms
    )


def test_prometheus_annotations_point_at_the_metrics_port() -> None:
    annotations = statefulset()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == container_port("metrics") == 9464
    assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"


# -- Services, disruption budget, network policy ------------------------------------------------


def test_client_service_selects_the_pods_and_targets_grpc() -> None:
    service = find("Service", "fastlane")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service["spec"].get("clusterIP") != "None"
    assert selects(service["spec"]["selector"], pod_labels())
    [port] = service["spec"]["ports"]
    target = port.get("targetPort", port["port"])
    resolved = container_port(target) if isinstance(target, str) else target
    assert port["port"] == resolved == container_port("grpc") == 7070
    assert port.get("appProtocol") == "grpc"


def test_disruption_budget_covers_the_pods() -> None:
    budget = find("PodDisruptionBudget", "fastlane")
    assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels())
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]


def _policy() -> dict[str, Any]:
    return find("NetworkPolicy", "fastlane", "networkpolicy.yaml")


def _ingress_ports(peer_matches: Any) -> set[int]:
    """Ports of the ingress rules with a peer for which ``peer_matches(peer)`` is true."""
    ports = set()
    for rule in _policy()["spec"]["ingress"]:
        if any(peer_matches(peer) for peer in rule["from"]):
            ports |= {port["port"] for port in rule["ports"]}
    return ports


def test_network_policy_guards_the_pods() -> None:
    spec = _policy()["spec"]
    assert selects(spec["podSelector"]["matchLabels"], pod_labels())
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    for rule in spec["ingress"]:
        # A rule without peers or ports admits everyone or every port.
        assert rule.get("from") and rule.get("ports"), rule
        for peer in rule["from"]:
            assert "ipBlock" not in peer, "no address range may reach the nodes: they have no authentication"


def test_network_policy_admits_grpc_only_from_clients_and_nodes() -> None:
    def client(peer: dict[str, Any]) -> bool:
        return peer.get("podSelector", {}).get("matchLabels") == {"fastlane/client": "true"}

    def node(peer: dict[str, Any]) -> bool:
        same_namespace = "namespaceSelector" not in peer
        return same_namespace and selects(peer.get("podSelector", {}).get("matchLabels", {}), pod_labels())

    assert _ingress_ports(client) == {7070}
    assert _ingress_ports(node) == {7070}
    assert _ingress_ports(lambda peer: not (client(peer) or node(peer))) == {9464}


def test_network_policy_admits_metrics_from_the_monitoring_namespace() -> None:
    def monitoring(peer: dict[str, Any]) -> bool:
        return peer.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": "monitoring"}

    assert _ingress_ports(monitoring) == {container_port("metrics")}


def test_network_policy_lets_nodes_reach_postgres_and_dns() -> None:
    allowed = {
        (port.get("protocol", "TCP"), port["port"]) for rule in _policy()["spec"]["egress"] for port in rule["ports"]
    }
    assert {("TCP", 5432), ("UDP", 53), ("TCP", 53)} <= allowed


# -- the development database ---------------------------------------------------------------------


def test_dev_postgres_is_marked_and_complete() -> None:
    text = (MANIFESTS / "dev-postgres.yaml").read_text()
    assert "NOT FOR PRODUCTION" in text
    database = find("StatefulSet", "fastlane-postgres", "dev-postgres.yaml")
    assert database["metadata"]["labels"]["fastlane/environment"] == "development"
    assert database["spec"]["replicas"] == 1
    assert database["spec"]["volumeClaimTemplates"]
    [postgres] = database["spec"]["template"]["spec"]["containers"]
    assert postgres["image"].startswith("postgres:15")
    service = find("Service", "fastlane-postgres", "dev-postgres.yaml")
    assert selects(service["spec"]["selector"], database["spec"]["template"]["metadata"]["labels"])
    assert database["spec"]["serviceName"] == service["metadata"]["name"]


def test_dev_dsn_matches_the_dev_database() -> None:
    credentials = find("Secret", "fastlane-postgres", "dev-postgres.yaml")["stringData"]
    dsn = find("Secret", "fastlane-db", "dev-postgres.yaml")["stringData"]["dsn"]
    expected = (
        f"postgresql://{credentials['POSTGRES_USER']}:{credentials['POSTGRES_PASSWORD']}"
        f"@fastlane-postgres.{NAMESPACE}.svc.cluster.local:5432/{credentials['POSTGRES_DB']}"
    )
    assert dsn == expected


# -- the image -------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def dockerfile_uid() -> int:
    users = [arguments for keyword, arguments in final_stage() if keyword == "USER"]
    assert users, "the final stage has no USER: the image would run as root"
    user = users[-1].split(":", 1)[0]
    assert user.isdigit(), f"USER {user!r}: use a numeric uid, so runAsNonRoot can check it"
    return int(user)


def test_image_runs_fastlane() -> None:
    stage = dict(final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["fastlane"]
    assert json.loads(stage["CMD"]) == ["serve"]


def test_image_does_not_run_as_root() -> None:
    assert dockerfile_uid() != 0
    users = [arguments for keyword, arguments in final_stage() if keyword == "USER"]
    assert users[-1].split(":", 1)[0] not in {"root", "0"}


def test_image_is_multi_stage_on_python_311_slim() -> None:
    instructions = dockerfile_instructions()
    defaults = dict(
        arguments.split("=", 1) for keyword, arguments in instructions if keyword == "ARG" and "=" in arguments
    )
    bases = [arguments.split()[0] for keyword, arguments in instructions if keyword == "FROM"]
    resolved = [re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], base) for base in bases]
    assert len(resolved) >= 2
    assert set(resolved) == {"python:3.11-slim"}


def test_image_exposes_the_grpc_and_metrics_ports() -> None:
    exposed = {int(port.split("/")[0]) for keyword, arguments in final_stage() if keyword == "EXPOSE"
               for port in arguments.split()}
    assert exposed == {7070, 9464} == {container_port("grpc"), container_port("metrics")}


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    ignored = {
        line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith(("#", "!"))
    }
    for keyword, arguments in dockerfile_instructions():
        if keyword != "COPY" or "--from" in arguments:
            continue
        *sources, _ = arguments.split()
        for source in sources:
            source = source.rstrip("/")
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert source not in ignored and source.split("/")[0] not in ignored, f"COPY {source}: ignored"
