#!/usr/bin/env bash
# Build the fastlane node image (deploy/Dockerfile) and the example worker image
# (examples/worker/Dockerfile), then smoke-test them together: a node on its default SQLite
# database and a worker connected to it, a job created through the node's API, its run done by
# the worker, and the worker's metrics scraped. Needs docker (with BuildKit) or podman; the test
# suite checks both Dockerfiles offline (tests/unit/test_deploy_manifests.py,
# tests/unit/test_worker_image.py), this builds and runs them.
#
#     scripts/build_images.sh [TAG]        # TAG: the node image's, default fastlane:<version>
set -euo pipefail
cd "$(dirname "$0")/.."

engine="${CONTAINER_ENGINE:-$(command -v docker || command -v podman || true)}"
if [ -z "$engine" ]; then
    echo "no container engine: install docker or podman (or set CONTAINER_ENGINE)" >&2
    exit 1
fi
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
node_image="${1:-fastlane:$version}"
worker_image="fastlane-example-worker:$version"
network="fastlane-smoke-$$"

echo "building $node_image and $worker_image with $engine" >&2
DOCKER_BUILDKIT=1 "$engine" build -f deploy/Dockerfile -t "$node_image" .
"$engine" build --build-arg "FASTLANE_IMAGE=$node_image" -t "$worker_image" examples/worker

cleanup() {
    "$engine" rm -f fastlane-smoke-node fastlane-smoke-worker >/dev/null 2>&1 || true
    "$engine" network rm "$network" >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$engine" network create "$network" >/dev/null
# Inside a network of its own only: the node listens on all of its container's addresses.
"$engine" run -d --name fastlane-smoke-node --network "$network" "$node_image" \
    serve --listen 0.0.0.0:7070 >/dev/null
"$engine" run -d --name fastlane-smoke-worker --network "$network" "$worker_image" \
    worker tasks:worker --server fastlane-smoke-node:7070 --metrics 127.0.0.1:9465 >/dev/null

node() { "$engine" exec fastlane-smoke-node fastlane "$@" --server 127.0.0.1:7070; }
for _ in $(seq 60); do node cluster >/dev/null 2>&1 && break; sleep 0.5; done
node cluster >/dev/null
node jobs create --name smoke --type reports.build --now --payload '{"name": "smoke"}' >/dev/null
for _ in $(seq 60); do
    if node runs list --job smoke --state succeeded --json | grep -q '"succeeded"'; then
        "$engine" exec fastlane-smoke-worker python -c \
            'import urllib.request; body = urllib.request.urlopen("http://127.0.0.1:9465/metrics").read().decode(); assert "fastlane_worker_attempts_total{" in body, body' \
            && { echo "smoke test passed: $node_image and $worker_image" >&2; exit 0; }
    fi
    sleep 0.5
done
echo "smoke test failed: the run did not succeed; the node's and the worker's logs follow" >&2
"$engine" logs fastlane-smoke-node >&2 || true
"$engine" logs fastlane-smoke-worker >&2 || true
exit 1
