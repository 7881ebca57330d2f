#!/usr/bin/env bash
# Vendor the dashboard's one third-party library (uPlot) into the Python package.
# Idempotent: run it again after changing the pinned version in package.json.
#   bash dashboard/build.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/../src/minou/dashboard/static/vendor"

cd "$here"
if [[ -f package-lock.json ]]; then
    npm ci --no-audit --no-fund --ignore-scripts
else
    npm install --no-audit --no-fund --ignore-scripts
fi

mkdir -p "$dest"
for f in uPlot.iife.min.js uPlot.min.css; do
    src="node_modules/uplot/dist/$f"
    [[ -f "$src" ]] || { echo "build.sh: missing $src" >&2; exit 1; }
    cp "$src" "$dest/$f"
done
cp node_modules/uplot/LICENSE "$dest/uPlot.LICENSE"

version="$(node -p 'require("./node_modules/uplot/package.json").version')"
echo "vendored uPlot $version into ${dest#"$here/../"}:"
ls -l "$dest"
