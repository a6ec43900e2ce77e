#!/usr/bin/env bash
# Tools the test suite needs besides Python packages: Chromium and ChromeDriver, for the web
# console's browser tests (Debian's chromium and chromium-driver, installed system-wide: a browser
# cannot be unpacked into a folder), libfaketime (Debian's faketime), which shifts and steps the
# wall clock of a node or worker process in the clock tests, fish (the shell), to test the
# completion script made for it, and promtool, to check and unit-test the alert rules in
# deploy/prometheus. Where none is on PATH or in DIR (the first argument, default
# .venv/bin), the distribution's prometheus package is downloaded and only its promtool binary
# extracted into DIR: nothing is installed system-wide and no Prometheus server is set up. Needs
# apt-get (Debian, Ubuntu); elsewhere this says what to install and fails, so the suite never
# silently skips those checks.
set -euo pipefail

into="${1:-.venv/bin}"
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo -n)

# apt_install WHAT PACKAGE...: install the distribution's packages, or say what is missing and fail.
apt_install() {
    local what="$1"
    shift
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "$what is missing: install it (Debian's $*)" >&2
        exit 1
    fi
    echo "installing $what (the distribution's $*)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! "${as_root[@]}" apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; then
        "${as_root[@]}" apt-get update -q >/dev/null
        "${as_root[@]}" apt-get install -y -q --no-install-recommends "$@" >/dev/null
    fi
}

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    apt_install "Chromium and ChromeDriver, for the console's browser tests," chromium chromium-driver
    /usr/bin/chromedriver --version >/dev/null
fi

if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    apt_install "libfaketime, for the clock tests," faketime
    ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null
fi

if ! command -v fish >/dev/null 2>&1; then
    apt_install "fish, to test the completion script made for it," fish
    fish --version >/dev/null
fi

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
    "${as_root[@]}" apt-get update -q >/dev/null
    (cd "$scratch" && apt-get download -q prometheus >/dev/null 2>&1)
fi
dpkg-deb -x "$scratch"/prometheus_*.deb "$scratch/extracted"
mkdir -p "$into"
cp "$scratch/extracted/usr/bin/promtool" "$into/promtool"
"$into/promtool" --version >/dev/null
