#!/usr/bin/env bash
# Fetch the dashboard's charting library, uPlot, from the npm registry into
# src/trainport/server/dashboard/vendor/ (ignored by git; packaged into the wheel with its
# licence). Pinned by version and by the tarball's SHA-256: a different file is refused.
# Idempotent: nothing is fetched when the pinned files are already there.
#   scripts/fetch-dashboard-vendor.sh [--dest DIR] [--sha256 HEX]
# (--dest and --sha256 are for testing the script: another folder, another expected sum.)
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.6.32
sha256=4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d
url="https://registry.npmjs.org/uplot/-/uplot-${version}.tgz"
dest=src/trainport/server/dashboard/vendor
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) dest=$2; shift 2 ;;
    --sha256) sha256=$2; shift 2 ;;
    *) echo "error: unknown option $1 (use --dest DIR or --sha256 HEX)" >&2; exit 2 ;;
  esac
done
stamp="$dest/.uplot-$version-${sha256:0:16}"

[ -e "$stamp" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching uPlot $version from the npm registry" >&2
if ! curl -fsSL --retry 3 -o "$tmp/uplot.tgz" "$url"; then
  echo "error: could not fetch $url; the dashboard's charts need it (check the network or" \
    "a proxy for registry.npmjs.org, then run scripts/fetch-dashboard-vendor.sh again)" >&2
  exit 1
fi
got=$(sha256sum "$tmp/uplot.tgz" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  echo "error: $url has SHA-256 $got, not the pinned $sha256; refusing it" >&2
  exit 1
fi
tar -xzf "$tmp/uplot.tgz" -C "$tmp" package/LICENSE package/dist/uPlot.iife.min.js package/dist/uPlot.min.css
mkdir -p "$dest"
rm -f "$dest"/.uplot-*
cp "$tmp/package/dist/uPlot.iife.min.js" "$dest/uPlot.iife.min.js"
cp "$tmp/package/dist/uPlot.min.css" "$dest/uPlot.min.css"
cp "$tmp/package/LICENSE" "$dest/uPlot.LICENSE"
touch "$stamp"
