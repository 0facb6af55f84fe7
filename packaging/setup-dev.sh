#!/usr/bin/env bash
# Prepare a fresh Debian bookworm / Raspberry Pi OS machine for edgeasr, as root or with sudo.
#
#   bash packaging/setup-dev.sh           what running edgeasr needs: a few system packages and
#                                         a virtualenv (.venv) with edgeasr and the tiny.en weights
#   bash packaging/setup-dev.sh --tests   also what the tests and the benchmark need: Mosquitto,
#                                         systemd's tools, Debian's packaging tools, a compiler for
#                                         systemd-python, espeak-ng, the base weights, CTranslate2,
#                                         the Silero and TEN speech detectors, Home Assistant's
#                                         sentences and the command set's piper voice, Docker
#                                         and debootstrap (the add-on's image), and a real Home
#                                         Assistant core (setup-homeassistant.sh)
#
# Every Python package is pinned by packaging/constraints.txt (Home Assistant's virtualenv by
# packaging/constraints-homeassistant.txt), so a new release upstream cannot
# change a test's numbers. Idempotent: a second run only checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

tests=0
case "${1:-}" in
    "") ;;
    --tests) tests=1 ;;
    *) echo "usage: $0 [--tests]" >&2; exit 64 ;;
esac

APT_PACKAGES=(
    # the interpreter and its venv module (Debian splits them)
    python3 python3-venv
    # capture (PortAudio for sounddevice), and alsa-utils' spoken prompts for the first run
    libportaudio2 alsa-utils
)
if [ "$tests" = 1 ]; then
    APT_PACKAGES+=(
        # the MQTT broker the tests start on loopback
        mosquitto mosquitto-clients openssl
        # systemd-python builds from source against libsystemd; systemd-analyze checks the unit
        build-essential python3-dev libsystemd-dev pkg-config systemd
        # .deb packaging and its install test with Debian's own python3
        debhelper dh-python lintian fakeroot dpkg-dev python3-systemd python3-yaml
        # speech in other languages for the multilingual tests
        espeak-ng
        # TEN VAD's library links against LLVM's C++ runtime
        libc++1
        # the Home Assistant add-on's image: Docker, and debootstrap for its local Debian base
        # (tests/test_addon_image.py starts dockerd when none runs)
        docker.io debootstrap
    )
fi

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
extras="weights"
[ "$tests" = 1 ] && extras="weights,base,systemd,bench,commands,dev,silero,ten"
# --use-pep517: systemd-python has no pyproject.toml; without it pip falls back to a deprecated
# `setup.py install`
.venv/bin/python -m pip install -q --disable-pip-version-check --use-pep517 \
    --constraint packaging/constraints.txt -e ".[$extras]"
echo "edgeasr environment ready ($extras): $(.venv/bin/edgeasr --version)"
# a real Home Assistant core for tests/test_assist_real.py, in a virtualenv of its own
if [ "$tests" = 1 ]; then
    bash packaging/setup-homeassistant.sh
fi
