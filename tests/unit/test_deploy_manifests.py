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
from fastlane.server.settings import Settings

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
NOT_FOR_PRODUCTION = {"dev-postgres.yaml", "secret.example.yaml", "worker.example.yaml"}
# Applied by hand where it fits: cert-manager's and the Prometheus Operator's kinds exist only
# where their CRDs are installed.
OPTIONAL = {"cert-manager.yaml", "prometheus-operator.yaml"}
CERT_MANAGER_API = "cert-manager.io/v1"
MONITORING_API = "monitoring.coreos.com/v1"
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
# Kinds the bundled schemas know; cert-manager's and the Prometheus Operator's are checked by hand below.
BUILT_IN_OBJECTS = [(path, doc) for path, doc in KUBERNETES_OBJECTS
                    if doc["apiVersion"] not in {CERT_MANAGER_API, MONITORING_API}]
CERT_MANAGER_OBJECTS = [(path, doc) for path, doc in KUBERNETES_OBJECTS if doc["apiVersion"] == CERT_MANAGER_API]
MONITORING_OBJECTS = [(path, doc) for path, doc in KUBERNETES_OBJECTS if doc["apiVersion"] == MONITORING_API]


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


@pytest.mark.parametrize("entry", BUILT_IN_OBJECTS, ids=[_document_id(e) for e in BUILT_IN_OBJECTS])
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
    not_applied = NOT_FOR_PRODUCTION | OPTIONAL | {"kustomization.yaml"}
    production = sorted(path.name for path in MANIFESTS.glob("*.yaml") if path.name not in not_applied)
    assert sorted(listed) == production
    assert not (NOT_FOR_PRODUCTION | OPTIONAL) & set(listed)
    # Every file the kustomization leaves out says why, and the kustomization names it.
    comment = (MANIFESTS / "kustomization.yaml").read_text()
    for name in NOT_FOR_PRODUCTION | OPTIONAL:
        assert name in comment, f"kustomization.yaml does not say why {name} is left out"


def test_custom_kinds_are_only_in_the_optional_files() -> None:
    assert {path.name for path, _ in CERT_MANAGER_OBJECTS} == {"cert-manager.yaml"}
    assert {path.name for path, _ in MONITORING_OBJECTS} == {"prometheus-operator.yaml"}


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

    def fake_serve(settings: Settings, **_: object) -> int:
        captured.append(settings)
        return 0

    monkeypatch.setattr("fastlane.server.node.serve", fake_serve)  # the function `fastlane serve` runs
    assert main(argv) == 0, f"fastlane {' '.join(argv)} was refused"
    [settings] = captured
    assert settings.db_url == SAMPLE_DSN
    assert settings.node_id == POD_NAME
    # Reachable from other pods: with tokens and TLS, not with --insecure.
    assert settings.listen == f"0.0.0.0:{container_port('grpc')}"
    assert settings.insecure is False
    assert settings.auth is True
    assert settings.tls_cert is not None and settings.tls_key is not None
    assert settings.health_listen == f"0.0.0.0:{container_port('health')}"
    assert settings.metrics_listen == f"0.0.0.0:{container_port('metrics')}"
    assert settings.advertised_address == f"{POD_NAME}.fastlane-headless.{NAMESPACE}.svc.cluster.local:7070"


def test_advertised_address_is_the_pods_stable_dns_name() -> None:
    assert env_var("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    service = statefulset()["spec"]["serviceName"]
    expected = f"$(POD_NAME).{service}.{NAMESPACE}.svc.cluster.local:{container_port('grpc')}"
    assert flag_value(container()["args"], "--advertise") == expected


@pytest.mark.parametrize("probe", ["readinessProbe", "livenessProbe", "startupProbe"])
def test_probe_uses_grpc_health_on_the_plain_health_port(probe: str) -> None:
    assert probe in container(), f"the fastlane container has no {probe}"
    check = container()[probe]
    assert set(check) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}
    # The kubelet's gRPC probes speak neither TLS nor tokens: they go to --health, not the API.
    health = flag_value(container()["args"], "--health")
    assert health is not None, "fastlane serve has no --health address for the probes"
    assert check["grpc"]["port"] == container_port("health") == int(health.rpartition(":")[2]) == 7071
    assert check["grpc"]["port"] != container_port("grpc")
    # Service "" is the node as a whole: SERVING once its window is loaded.
    assert check["grpc"].get("service", "") == ""


def test_health_port_is_reachable_by_the_kubelet() -> None:
    # The kubelet probes the pod's IP: a loopback --health would never answer.
    assert flag_value(container()["args"], "--health") == f"0.0.0.0:{container_port('health')}"


# -- tokens and TLS ----------------------------------------------------------------------------------


TLS_SECRET = "fastlane-tls"
TLS_SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # what a kubernetes.io/tls Secret (cert-manager's) holds


def _containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, template in pod_templates():
        for each in template["containers"] + template.get("initContainers", []):
            yield f"{name}:{each['name']}", each


@pytest.mark.parametrize("entry", list(_containers()), ids=[name for name, _ in _containers()])
def test_no_container_runs_with_insecure(entry: tuple[str, dict[str, Any]]) -> None:
    _, each = entry
    words = each.get("command", []) + each.get("args", [])
    assert not [word for word in words if word == "--insecure" or word.startswith("--insecure=")]


def test_node_requires_tokens_and_tls() -> None:
    args = container()["args"]
    assert "--auth" in args
    assert flag_value(args, "--tls-cert") and flag_value(args, "--tls-key")


def _secret_file(path: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The mount, the volume and the Secret key a file path of the fastlane container comes from."""
    mounts = [mount for mount in container()["volumeMounts"] if path.startswith(mount["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{path} is not under exactly one volume mount: {mounts}"
    [mount] = mounts
    volumes = {volume["name"]: volume for volume in pod_spec()["volumes"]}
    return mount, volumes[mount["name"]], path[len(mount["mountPath"].rstrip("/")) + 1:]


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key", "--tls-client-ca"])
def test_tls_flags_name_files_of_the_mounted_tls_secret(flag: str) -> None:
    path = flag_value(container()["args"], flag)
    if path is None:
        assert flag == "--tls-client-ca", f"{flag} is missing"
        return  # mutual TLS is optional
    mount, volume, key = _secret_file(path)
    assert volume.get("secret", {}).get("secretName") == TLS_SECRET, f"{flag} {path}: not from the Secret {TLS_SECRET}"
    assert key in TLS_SECRET_KEYS, f"{flag} {path}: {key} is not a key of a kubernetes.io/tls Secret"
    items = volume["secret"].get("items")
    assert items is None or key in {item["path"] for item in items}
    assert mount.get("readOnly") is True
    # A subPath mount is never updated: a renewed certificate would not reach the node.
    assert "subPath" not in mount and "subPathExpr" not in mount


def test_the_node_can_read_its_tls_key() -> None:
    _, volume, _ = _secret_file(flag_value(container()["args"], "--tls-key") or "")
    mode = volume["secret"].get("defaultMode", 0o644)
    group = pod_spec()["securityContext"].get("fsGroup")
    # The files belong to root, and to the fsGroup if there is one; the node runs as 10001.
    assert mode & 0o004 or (mode & 0o040 and group is not None), f"mode {mode:o}, fsGroup {group}"
    assert not mode & 0o002 and not mode & 0o020, "the key must not be writable by the node"


def _certificate(name: str) -> dict[str, Any]:
    return find("Certificate", name, "cert-manager.yaml")


def _covers(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        first, _, rest = host.partition(".")
        return bool(first) and rest == pattern[2:]
    return pattern == host


def test_cert_manager_certificate_fills_the_mounted_secret_for_every_name_of_a_node() -> None:
    certificate = _certificate(TLS_SECRET)["spec"]
    assert certificate["secretName"] == TLS_SECRET
    assert "server auth" in certificate["usages"]
    names = certificate["dnsNames"]
    advertised = (flag_value(container()["args"], "--advertise") or "").rpartition(":")[0]
    wanted = [
        advertised.replace("$(POD_NAME)", f"{statefulset()['metadata']['name']}-{index}")
        for index in range(statefulset()["spec"]["replicas"] + 2)  # and a scale-up
    ]
    wanted += [f"fastlane.{NAMESPACE}.svc.cluster.local", f"fastlane.{NAMESPACE}.svc", "localhost"]
    for host in wanted:
        assert any(_covers(pattern, host) for pattern in names), f"the certificate does not cover {host}"
    # The kubelet renews the mounted files; the node follows them (fastlane.auth.tls).
    assert certificate.get("privateKey", {}).get("rotationPolicy") == "Always"


# cert-manager v1's fields (its CRDs are not bundled with kubernetes-validate): a misspelt field
# would be dropped by the API server, and the certificate would quietly lack it.
_CERTIFICATE_SPEC = {
    "additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses", "encodeUsagesInRequest",
    "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject", "nameConstraints", "otherNames", "privateKey",
    "renewBefore", "renewBeforePercentage", "revisionHistoryLimit", "secretName", "secretTemplate", "subject", "uris",
    "usages",
}
_ISSUER_SPEC = {"acme", "ca", "selfSigned", "vault", "venafi"}
_KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement", "data encipherment",
    "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth", "client auth", "code signing",
    "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
}
_GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")


@pytest.mark.parametrize("entry", CERT_MANAGER_OBJECTS, ids=[_document_id(e) for e in CERT_MANAGER_OBJECTS])
def test_cert_manager_objects_use_known_fields(entry: tuple[Path, dict[str, Any]]) -> None:
    _, document = entry
    assert set(document) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(document["metadata"]) <= {"name", "namespace", "labels", "annotations"}
    spec = document["spec"]
    if document["kind"] == "Issuer":
        assert len(spec) == 1 and set(spec) <= _ISSUER_SPEC, spec
        if "ca" in spec:
            assert set(spec["ca"]) <= {"secretName", "crlDistributionPoints", "ocspServers", "issuingCertificateURLs"}
            # The CA issuer signs with the key of a CA certificate made here.
            [ca] = [doc for _, doc in CERT_MANAGER_OBJECTS
                    if doc["kind"] == "Certificate" and doc["spec"]["secretName"] == spec["ca"]["secretName"]]
            assert ca["spec"].get("isCA") is True
        return
    assert document["kind"] == "Certificate"
    assert set(spec) <= _CERTIFICATE_SPEC, set(spec) - _CERTIFICATE_SPEC
    assert spec["secretName"]
    assert set(spec.get("privateKey", {})) <= {"algorithm", "encoding", "size", "rotationPolicy"}
    assert spec.get("privateKey", {}).get("algorithm", "RSA") in {"RSA", "ECDSA", "Ed25519"}
    assert set(spec.get("usages", [])) <= _KEY_USAGES
    for field in ("duration", "renewBefore"):
        if field in spec:
            assert _GO_DURATION.match(spec[field]), f"{field} {spec[field]!r} is not a Go duration"
    reference = spec["issuerRef"]
    assert set(reference) <= {"name", "kind", "group"}
    assert reference.get("group", "cert-manager.io") == "cert-manager.io"
    if reference.get("kind", "Issuer") == "Issuer":
        issuers = [doc for _, doc in CERT_MANAGER_OBJECTS if doc["kind"] == "Issuer"]
        assert reference["name"] in {issuer["metadata"]["name"] for issuer in issuers}


# -- the worker example ------------------------------------------------------------------------------


def _worker() -> dict[str, Any]:
    deployment = find("Deployment", "acme-worker", "worker.example.yaml")
    [worker] = deployment["spec"]["template"]["spec"]["containers"]
    return worker


def test_worker_example_reads_its_token_from_the_example_secret() -> None:
    [token] = [entry for entry in _worker()["env"] if entry["name"] == "FASTLANE_TOKEN"]
    reference = token["valueFrom"]["secretKeyRef"]
    example = find("Secret", reference["name"], "worker.example.yaml")
    assert set(example["stringData"]) == {reference["key"]}
    assert flag_value(_worker()["command"] + _worker()["args"], "--token-file") is None  # the variable is enough


def test_worker_example_trusts_the_ca_it_mounts() -> None:
    ca = flag_value(_worker()["args"], "--tls-ca")
    assert ca is not None
    deployment = find("Deployment", "acme-worker", "worker.example.yaml")
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    [mount] = [mount for mount in _worker()["volumeMounts"] if ca.startswith(mount["mountPath"] + "/")]
    assert volumes[mount["name"]]["configMap"]["name"] == "fastlane-ca"
    # The example is admitted to the nodes by the NetworkPolicy.
    assert deployment["spec"]["template"]["metadata"]["labels"]["fastlane/client"] == "true"


def test_fastlane_worker_accepts_the_example_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker()
    assert worker["command"][:2] == ["fastlane", "worker"]
    for entry in worker["env"]:
        monkeypatch.setenv(entry["name"], entry.get("value", "fl_abcdefghijkl_0123456789abcdef"))
    captured: dict[str, Any] = {}

    def fake_run_worker_cli(target: str, servers: list[str], concurrency: int | None, **kwargs: Any) -> int:
        captured.update(target=target, servers=servers, **kwargs)
        return 0

    monkeypatch.setattr("fastlane.worker.run_worker_cli", fake_run_worker_cli)
    monkeypatch.setattr("fastlane.runtime.logs.configure", lambda *args, **kwargs: None)
    argv = worker["command"][1:] + worker["args"]
    assert main(argv) == 0, f"fastlane {' '.join(argv)} was refused"
    assert captured["servers"] == [f"fastlane.{NAMESPACE}.svc.cluster.local:7070"]
    assert captured["token"] == "fl_abcdefghijkl_0123456789abcdef"
    assert str(captured["tls"].ca_file) == flag_value(worker["args"], "--tls-ca")


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


def test_console_is_served_over_tls_behind_its_own_service_that_keeps_a_browser_on_one_node() -> None:
    args = container()["args"]
    listen = flag_value(args, "--console")
    assert listen is not None and int(listen.rsplit(":", 1)[1]) == container_port("console") == 8443
    assert flag_value(args, "--tls-cert") and "--auth" in args  # HTTPS, and a token to sign in
    service = find("Service", "fastlane-console")
    assert selects(service["spec"]["selector"], pod_labels())
    assert service["spec"]["sessionAffinity"] == "ClientIP"  # sessions live in the node that made them
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == "console" and port["appProtocol"] == "https"


def test_network_policy_admits_the_console_only_from_labelled_pods() -> None:
    def console(peer: dict[str, Any]) -> bool:
        return peer.get("podSelector", {}).get("matchLabels") == {"fastlane/console": "true"}

    assert _ingress_ports(console) == {container_port("console")}
    assert container_port("console") not in _ingress_ports(lambda peer: not console(peer))


def test_service_monitor_scrapes_every_node_through_the_headless_service() -> None:
    [monitor] = [doc for _, doc in MONITORING_OBJECTS if doc["kind"] == "ServiceMonitor"]
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    spec = monitor["spec"]
    assert set(spec) <= {"jobLabel", "selector", "namespaceSelector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    scraped = [name for name in ("fastlane-headless", "fastlane", "fastlane-console")
               if selects(spec["selector"]["matchLabels"], find("Service", name)["metadata"]["labels"])
               and any(port["name"] == "metrics" for port in find("Service", name)["spec"]["ports"])]
    assert scraped == ["fastlane-headless"]  # one target per pod, not one per Service address
    [endpoint] = spec["endpoints"]
    assert set(endpoint) <= {"port", "path", "scheme", "interval"}
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("metrics", "/metrics", "http")
    assert _GO_DURATION.match(endpoint["interval"])
    # The alert rules group by job="fastlane": the job label comes from the Service's name label.
    assert find("Service", "fastlane-headless")["metadata"]["labels"][spec["jobLabel"]] == "fastlane"


def test_pod_monitor_scrapes_the_workers_own_metrics_and_no_node() -> None:
    assert sorted(doc["kind"] for _, doc in MONITORING_OBJECTS) == ["PodMonitor", "ServiceMonitor"]
    [monitor] = [doc for _, doc in MONITORING_OBJECTS if doc["kind"] == "PodMonitor"]
    spec = monitor["spec"]
    assert set(spec) <= {"jobLabel", "selector", "namespaceSelector", "podMetricsEndpoints"}
    worker = find("Deployment", "acme-worker", "worker.example.yaml")["spec"]["template"]
    assert selects(spec["selector"]["matchLabels"], worker["metadata"]["labels"])
    assert not selects(spec["selector"]["matchLabels"], pod_labels())  # nodes have their ServiceMonitor
    [endpoint] = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("metrics", "/metrics", "http")
    [container] = worker["spec"]["containers"]
    [port] = [p for p in container["ports"] if p["name"] == endpoint["port"]]
    # The worker serves its metrics on that port, on every address of its pod.
    args = container["args"]
    assert args[args.index("--metrics") + 1] == f"0.0.0.0:{port['containerPort']}"


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
            # Defence in depth for the API, the only guard of the metrics: no address range.
            assert "ipBlock" not in peer, "no address range may reach the nodes"


def test_network_policy_admits_grpc_only_from_clients_and_nodes() -> None:
    def client(peer: dict[str, Any]) -> bool:
        return peer.get("podSelector", {}).get("matchLabels") == {"fastlane/client": "true"}

    def node(peer: dict[str, Any]) -> bool:
        same_namespace = "namespaceSelector" not in peer
        return same_namespace and selects(peer.get("podSelector", {}).get("matchLabels", {}), pod_labels())

    assert _ingress_ports(client) == {7070}
    assert _ingress_ports(node) == {7070}
    assert _ingress_ports(lambda peer: not (client(peer) or node(peer))) == {9464, 8443}  # metrics, console


def test_network_policy_admits_nobody_to_the_health_port() -> None:
    # Only the kubelet probes it, from the node, which NetworkPolicy does not govern.
    assert container_port("health") not in _ingress_ports(lambda peer: True)


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


def test_image_exposes_the_grpc_health_and_metrics_ports() -> None:
    exposed = {int(port.split("/")[0]) for keyword, arguments in final_stage() if keyword == "EXPOSE"
               for port in arguments.split()}
    assert exposed == {7070, 7071, 9464} == {container_port("grpc"), container_port("health"), container_port("metrics")}


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
