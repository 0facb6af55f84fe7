#!/usr/bin/env bash
# Prepare a fresh Debian bookworm / Raspberry Pi OS machine for edgeasr development:
# system packages, then a virtualenv in .venv with edgeasr and all its extras.
# Idempotent: a second run only checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    # capture (PortAudio for sounddevice) and alsa-utils' spoken prompts for the first run
    libportaudio2 alsa-utils
    # the MQTT broker the tests start on loopback
    mosquitto mosquitto-clients openssl
    # systemd-python builds against libsystemd; systemd-analyze checks the unit
    libsystemd-dev pkg-config gcc systemd
    # .deb packaging and its install test with Debian's own python3
    debhelper dh-python lintian fakeroot dpkg-dev python3-venv python3-systemd python3-yaml
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get -q -o DPkg::Lock::Timeout=600 update
    $SUDO apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e ".[weights,systemd,bench,dev]"
echo "edgeasr dev environment ready: $(.venv/bin/edgeasr --version 2>/dev/null || echo '(cli not built yet)')"
