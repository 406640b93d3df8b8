#!/usr/bin/env bash
# Set up trainport on a fresh machine: system packages (as root, via apt-get), a virtual
# environment in .venv, and trainport with its extras. Idempotent: re-running is cheap.
#   scripts/setup.sh          runtime + PyTorch (for the demo)
#   scripts/setup.sh --test   also the test and check tools, and .venv-sdk3 (SageMaker SDK v3)
set -euo pipefail
cd "$(dirname "$0")/.."

extras="torch"
[ "${1:-}" = "--test" ] && extras="torch,test"

# System packages: the sandbox runner's runtimes, runc with tini as its init (as root) and
# bubblewrap (as a normal user); nftables for each job's own network (NAT out, nothing of
# the machine or of other jobs in).
apt_packages="bubblewrap runc tini nftables"
# The tests also need: FUSE (FastFile mode), Chromium (the dashboard, driven by playwright),
# OpenMPI (MPI jobs; its compiler wrappers and cmake build Horovod, see below).
[ "${1:-}" = "--test" ] && apt_packages="$apt_packages fuse libfuse2 chromium openmpi-bin libopenmpi-dev cmake g++"
# Container jobs: podman with runc (crun refuses hybrid cgroups), busybox-static for the
# test images built locally (no registry is reachable); docker.io for the same tests under
# docker (they start a private dockerd of their own; this script starts no service);
# mmdebstrap for the Python image of the script-mode container tests (see below).
[ "${1:-}" = "--test" ] && apt_packages="$apt_packages podman runc busybox-static docker.io"
[ "${1:-}" = "--test" ] && apt_packages="$apt_packages mmdebstrap"
missing=""
for p in $apt_packages; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing system packages:$missing" >&2
    scripts/apt-install.sh $missing
  else
    echo "note: system packages missing ($missing); the sandbox runner may be unavailable" >&2
  fi
fi

# The dashboard's charting library (uPlot, from the npm registry, pinned and checksummed):
# before the install below, which packages it into the wheel.
scripts/fetch-dashboard-vendor.sh

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.trainport-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$extras"
if [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned (torch==2.13.0, a CPU wheel): unpinned it would pull GBs of CUDA.
  .venv/bin/python -m pip install -q -e ".[$extras]"
  rm -f .venv/.trainport-*
  touch "$stamp"
fi
# Horovod for the MPI tests: built from source for this torch, cached by its inputs.
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -c 'import horovod.torch' 2>/dev/null || scripts/build-horovod.sh >&2
fi
# The Python image with the sagemaker-training toolkit and torch, for the container tests
# of script mode and torchrun: built once (about 2 minutes), then kept in podman and cached.
if [ "${1:-}" = "--test" ] && [ "$(id -u)" = 0 ] && command -v podman >/dev/null; then
  scripts/build-python-image.sh >/dev/null
fi
# The SageMaker Python SDK v3, for docs/sagemaker-sdk.md's ModelTrainer example: it cannot
# share .venv with v2, so it has a venv of its own, keyed by its own stamp (the
# requirement and the Python): other edits to this script do not reinstall it.
if [ "${1:-}" = "--test" ]; then
  sdk3_requirement="sagemaker>=3,<4"
  if [ ! -x .venv-sdk3/bin/python ]; then
    "$python" -m venv .venv-sdk3
  fi
  sdk3_key=$(printf '%s %s' "$sdk3_requirement" "$(.venv-sdk3/bin/python --version)" | sha256sum)
  sdk3_stamp=".venv-sdk3/.trainport-sdk3-$(echo "$sdk3_key" | cut -c1-16)"
  if [ ! -e "$sdk3_stamp" ]; then
    echo "installing $sdk3_requirement into .venv-sdk3" >&2
    .venv-sdk3/bin/python -m pip install -q "$sdk3_requirement"
    rm -f .venv-sdk3/.trainport-sdk3-*
    touch "$sdk3_stamp"
  fi
fi
