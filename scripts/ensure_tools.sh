#!/usr/bin/env bash
# Tools the test suite needs besides Python packages: promtool, to check and unit-test the alert
# rules in deploy/prometheus. Installed from the distribution's packages where missing (Debian and
# Ubuntu: the prometheus package, which ships promtool), as root or through sudo; otherwise this
# says what to install and fails, so the suite never silently skips those checks.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "promtool is missing and there is no apt-get here: install Prometheus's promtool and put it on PATH" >&2
    exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "promtool is missing: install the prometheus package (it ships promtool) as root" >&2
        exit 1
    fi
    as_root=(sudo -n)
fi
echo "installing promtool (the distribution's prometheus package) for the alert-rule tests" >&2
export DEBIAN_FRONTEND=noninteractive
install=("${as_root[@]}" apt-get install -y -q --no-install-recommends prometheus)
# A machine whose package lists were never fetched finds no package: fetch them, then try again.
if ! "${install[@]}" >/dev/null; then
    "${as_root[@]}" apt-get update -q >/dev/null
    "${install[@]}" >/dev/null
fi
command -v promtool >/dev/null
