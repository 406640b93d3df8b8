#!/usr/bin/env bash
# Build a local Debian image with Python 3, the sagemaker-training toolkit and torch (CPU), the
# way SageMaker's framework containers are made, without any registry: mmdebstrap makes a
# minimal Debian from the mirror this machine's apt uses, podman imports it, and one podman
# build layer pip-installs the toolkit and torch. The image has no ENTRYPOINT, so a job runs
# `image train`: the toolkit's `train`, which runs the job's script (script mode).
#
#   scripts/build-python-image.sh          build (or load, or find) the image; prints its tag
#   scripts/build-python-image.sh --tag    print the tag only (tests find the image by it)
#   DEBIAN_MIRROR=URL DEBIAN_SUITE=NAME    another mirror or release than apt's own
#
# The tag is localhost/trainport-python:KEY, KEY a hash of every input (this script, the
# mirror, the suite, the architecture); the built image is saved under
# ~/.cache/trainport/images/ and loaded from there, so a rerun takes seconds.
# Needs: mmdebstrap and podman (scripts/setup.sh --test installs them), root, and .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

toolkit="sagemaker-training==5.1.4"
torch="torch==2.13.0"

# The Debian mirror and release apt uses here: the image gets the same packages as the machine.
apt_debian() {
  apt-get indextargets --format '$(REPO_URI) $(CODENAME)' \
    'Created-By: Packages' 'Label: Debian' 'Component: main' 2>/dev/null | sort -u | head -1
}
read -r found_mirror found_suite < <(apt_debian || true; echo)
mirror=${DEBIAN_MIRROR:-${found_mirror:-http://deb.debian.org/debian}}
suite=${DEBIAN_SUITE:-${found_suite:-bookworm}}
arch=$(uname -m)
key=$(printf '%s %s %s\n' "$mirror" "$suite" "$arch" | cat - "$0" | sha256sum | cut -c1-12)
tag="localhost/trainport-python:$key"
if [ "${1:-}" = "--tag" ]; then
  echo "$tag"
  exit 0
fi

cache="$HOME/.cache/trainport/images"
archive="$cache/trainport-python-$key.tar"
if podman image exists "$tag"; then
  echo "$tag"
  exit 0
fi
if [ -s "$archive" ]; then
  podman load -q -i "$archive" >/dev/null
  echo "$tag"
  exit 0
fi

command -v mmdebstrap >/dev/null || { echo "no mmdebstrap: apt-get install mmdebstrap" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }
# Podman 4.3 here: crun refuses hybrid cgroups, and the default rlimits are refused.
engine_flags=(--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
work=$(mktemp -d)
base="localhost/trainport-python-base:$key"
trap 'rm -rf "$work"; podman rmi -f "$base" >/dev/null 2>&1 || true' EXIT

echo "building $tag: Debian $suite from $mirror, then $toolkit and $torch (a few minutes)" >&2
# minbase: no init, no docs worth keeping; pip and venv for the job's requirements.txt.
mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  "$suite" "$work/rootfs.tar" "$mirror"
podman import -q "$work/rootfs.tar" "$base" >/dev/null
rm -f "$work/rootfs.tar"

# torch is resolved by this machine's pip, as scripts/setup.sh installs it (its configured
# index holds the CPU wheel; an unpinned torch from PyPI would be GBs of CUDA), for the
# image's Python and platform, then mounted into the build.
py=$(podman run --rm "${engine_flags[@]}" --network none "$base" \
  python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
mkdir -p "$work/wheels"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" \
  --python-version "$py" --implementation cp --abi "cp$py" \
  --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" \
  --platform "manylinux2014_$arch" "$torch" 2> >(grep -v "is ignored: it is neither" >&2)

# pip in the build reaches PyPI the way this machine's pip does: through the same index
# (http ones; file:// indexes are not in the container) and trusting the same certificates
# (a proxy here may re-sign TLS with a local CA). These reach the build only, not the image.
pip_setting() {
  local value
  value=$(.venv/bin/python -m pip config get "global.$1" 2>/dev/null) || value=""
  echo "$value"
}
index=${PIP_INDEX_URL:-$(pip_setting index-url)}
extra=""
for url in ${PIP_EXTRA_INDEX_URL:-$(pip_setting extra-index-url)}; do
  case "$url" in http*) extra="$extra $url" ;; esac
done
cert=${PIP_CERT:-$(pip_setting cert)}
build_flags=()
build_args=""
add_arg() {
  build_flags+=(--build-arg "$1=$2")
  build_args="${build_args}ARG $1"$'\n'
}
case "$index" in http*) add_arg PIP_INDEX_URL "$index" ;; esac
[ -n "$extra" ] && add_arg PIP_EXTRA_INDEX_URL "${extra# }"
if [ -n "$cert" ] && [ -f "$cert" ]; then
  build_flags+=(-v "$cert:/run/host-ca.crt:ro")
  add_arg PIP_CERT /run/host-ca.crt
fi

# The toolkit builds a small C extension (its gethostname for MPI), so gcc and the Python
# headers are there for the install and gone in the same layer. Debian marks its Python
# externally managed; a framework container's pip installs into it (the toolkit installs a
# job's requirements.txt), as PIP_BREAK_SYSTEM_PACKAGES allows, here and in jobs.
cat >"$work/Containerfile" <<EOF
FROM $base
$build_args
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1 LANG=C.UTF-8
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update -q >/dev/null && \
    apt-get install -y -q --no-install-recommends gcc libc6-dev python3-dev >/dev/null && \
    pip install -q /wheels/torch-*.whl numpy "$toolkit" && \
    apt-get purge -y -q --autoremove gcc libc6-dev python3-dev >/dev/null && \
    rm -rf /var/lib/apt/lists/* /root/.cache
CMD ["python3"]
EOF
# --network host: pip and apt reach PyPI and the mirror the way this machine does.
podman build -q "${engine_flags[@]}" "${build_flags[@]}" --network host \
  -v "$work/wheels:/wheels:ro" -f "$work/Containerfile" -t "$tag" "$work" >/dev/null
mkdir -p "$cache"
# An older key's image is not used again: its archive and tag go (a GB and more each).
rm -f "$cache"/trainport-python-*.tar
podman images --format '{{.Repository}}:{{.Tag}}' localhost/trainport-python |
  grep -v -x -F "$tag" | xargs -r podman rmi -f >/dev/null 2>&1 || true
podman save -q -o "$archive.part" "$tag"
mv "$archive.part" "$archive"
echo "$tag"
