#!/usr/bin/env bash
# The engine package (services/engine/src/jacana_engine: kernels, layers, runtime) as
# revision REV (default HEAD) has it, in .xfer/ab_engine, for `bench/gpu_suite.sh ab` to
# time the working tree against (carry .xfer/ab_engine):
#
#   bench/ab_engine.sh cbe4cbe
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
dir=.xfer/ab_engine
rm -rf "$dir" && mkdir -p "$dir"
grep -qx '/.xfer/' .git/info/exclude 2>/dev/null || echo '/.xfer/' >>.git/info/exclude
git archive "$rev" services/engine/src/jacana_engine | tar -x -C "$dir" --strip-components=4
echo "$(find "$dir" -name '*.py' | wc -l) engine files of $(git rev-parse --short "$rev") in $dir"
