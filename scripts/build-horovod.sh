#!/usr/bin/env bash
# Build and install Horovod for this project's environment (.venv), for scripts that use it.
#
# Horovod's last release (0.28.1) does not build against current PyTorch as published: its
# CMake files ask for C++14 (PyTorch's headers need C++17) and build the bundled gloo as
# C++11 (which then defines gloo::rendezvous::Store::kDefaultTimeout twice). This script
# builds it from the release's source with all three raised to C++17, with the MPI and gloo
# controllers and the PyTorch ops, without build isolation (it must compile against the
# torch already installed), and keeps the wheel in a cache keyed by every input (Horovod,
# torch and Python versions, and this script), so a second run only installs.
#
#   scripts/build-horovod.sh            build (or reuse) the wheel and install it
#   HOROVOD_WHEEL_CACHE=DIR ...         where wheels are kept (default ~/.cache/trainport/wheels)
#
# Needs: OpenMPI (scripts/setup.sh --test installs it), cmake, g++, and torch in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.28.1
python=.venv/bin/python
[ -x "$python" ] || { echo "no .venv: run scripts/setup.sh --test first" >&2; exit 1; }
command -v mpicxx >/dev/null || { echo "no MPI compiler: apt-get install libopenmpi-dev" >&2; exit 1; }
command -v cmake >/dev/null || { echo "no cmake: apt-get install cmake" >&2; exit 1; }

torch_version=$("$python" -c 'import torch; print(torch.__version__)')
py_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key=$( (echo "$version $torch_version $py_version"; cat "$0") | sha256sum | cut -c1-16)
cache="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/trainport/wheels}/horovod-$key"

if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "building horovod $version for torch $torch_version (several minutes)" >&2
  "$python" -m pip download -q --no-deps --no-binary :all: "horovod==$version" -d "$work"
  tar xzf "$work/horovod-$version.tar.gz" -C "$work"
  src="$work/horovod-$version"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i 's/-std=c++11/-std=c++17/' "$src/third_party/gloo/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || {
    echo "horovod $version's CMake files changed shape; cannot patch them" >&2
    exit 1
  }
  # setuptools' wheel support must be there without build isolation.
  "$python" -m pip install -q wheel
  (
    cd "$src"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    export MAKEFLAGS="-j$(nproc)"
    "$OLDPWD/$python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" . \
      >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
  )
  mkdir -p "$cache"
  mv "$work"/dist/horovod-*.whl "$cache"/
fi
"$python" -m pip install -q "$cache"/horovod-*.whl
"$python" -c 'import horovod, horovod.torch as hvd; print("horovod", horovod.__version__, "mpi:", hvd.mpi_built(), "gloo:", hvd.gloo_built())'
