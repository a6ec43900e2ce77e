#!/usr/bin/env bash
# Tools the test suite needs besides Python packages: promtool, to check and unit-test the alert
# rules in deploy/prometheus. Where none is on PATH or in DIR (the first argument, default
# .venv/bin), the distribution's prometheus package is downloaded and only its promtool binary
# extracted into DIR: nothing is installed system-wide and no Prometheus server is set up. Needs
# apt-get (Debian, Ubuntu); elsewhere this says what to install and fails, so the suite never
# silently skips those checks.
set -euo pipefail

into="${1:-.venv/bin}"
if command -v promtool >/dev/null 2>&1 || [ -x "$into/promtool" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "promtool is missing: install Prometheus's promtool (e.g. the prometheus package) and put it on PATH" >&2
    exit 1
fi
echo "fetching promtool (from the distribution's prometheus package) into $into, for the alert-rule tests" >&2
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# A machine whose package lists were never fetched finds no package: fetch them (as root, or
# through sudo without a password), then try again.
if ! (cd "$scratch" && apt-get download -q prometheus >/dev/null 2>&1); then
    as_root=()
    [ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
    "${as_root[@]}" apt-get update -q >/dev/null
    (cd "$scratch" && apt-get download -q prometheus >/dev/null 2>&1)
fi
dpkg-deb -x "$scratch"/prometheus_*.deb "$scratch/extracted"
mkdir -p "$into"
cp "$scratch/extracted/usr/bin/promtool" "$into/promtool"
"$into/promtool" --version >/dev/null
