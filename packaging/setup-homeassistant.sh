#!/usr/bin/env bash
# Home Assistant core in a virtualenv of its own (.venv-homeassistant, or the directory given), for
# tests/test_assist_real.py and `edgeasr bench-assist`: the newest release that runs on a Python
# this machine has (packaging/constraints-homeassistant.txt pins both): 2025.4.4 on Python 3.13
# (python3.13 on PATH or a pyenv 3.13), else 2024.3.3 on python3 (Debian bookworm's 3.11).
# HA_PYTHON=/path/to/python chooses the interpreter. setup-dev.sh --tests runs this.
# Idempotent: a second run only checks what is there (uv, ~1 s). Needs PyPI, once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-homeassistant}
constraints=packaging/constraints-homeassistant.txt

is_313() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; }
pick_python() {
    if [ -n "${HA_PYTHON:-}" ]; then echo "$HA_PYTHON"; return; fi
    local p
    for p in python3.13 "$HOME"/.pyenv/versions/3.13*/bin/python /root/.pyenv/versions/3.13*/bin/python; do
        if command -v "$p" > /dev/null && is_313 "$p"; then command -v "$p"; return; fi
    done
    echo python3
}
python=$(pick_python)
want=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
have=$([ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' || true)
if [ "$have" != "$want" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --constraint "$constraints" uv
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --requirement "$constraints" --constraint "$constraints"
echo "Home Assistant ready in $venv: $("$venv/bin/hass" --version) on Python $want"
