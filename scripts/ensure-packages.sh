#!/usr/bin/env bash
# scripts/ensure-packages.sh CMD:PACKAGE ... — installs each Debian PACKAGE whose CMD is not
# on PATH (apt-get update first), with sudo when not root. Sourced or run by the scripts
# the README names, so they work on a fresh machine.
set -euo pipefail
missing=()
for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]} from Debian packages"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    command -v apt-get >/dev/null 2>&1 || { echo "need ${missing[*]} and apt-get is not available" >&2; exit 1; }
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
