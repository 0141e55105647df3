#!/usr/bin/env bash
# Installs everything torch-emugpu needs on a fresh Debian 12 machine and
# builds it into .venv. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# iproute2: `ip netns` for test_torchrun.py's emulated nodes in network namespaces;
# clang-format: scripts/test.sh checks the C++ style (.clang-format).
packages=(g++ nlohmann-json3-dev libgtest-dev libboost-dev ninja-build iproute2 clang-format)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# torch and torchvision come from this machine's local wheel store at these versions.
# build: test_wheel.py makes the wheel with `python -m build --wheel --no-isolation`.
.venv/bin/pip install -q --disable-pip-version-check \
  torch==2.14.1 torchvision==0.29.1 pytest ruff mypy tqdm numpy matplotlib cmake ninja setuptools wheel build
.venv/bin/pip install -q --disable-pip-version-check --no-build-isolation -e .
