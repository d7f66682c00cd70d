#!/usr/bin/env bash
# The engine package (services/engine/src/jacana_engine: kernels, layers, runtime) as
# revision REV (default HEAD) has it, in .xfer/ab_engine (side "base"), or with a side
# name in .xfer/ab_engine_NAME, for `bench/gpu_suite.sh ab` to time the working tree
# against (carry .xfer; every side found there takes part):
#
#   bench/ab_engine.sh cbe4cbe
#   bench/ab_engine.sh eb22692 old
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
dir=.xfer/ab_engine${2:+_$2}
rm -rf "$dir" && mkdir -p "$dir"
grep -qx '/.xfer/' .git/info/exclude 2>/dev/null || echo '/.xfer/' >>.git/info/exclude
git archive "$rev" services/engine/src/jacana_engine | tar -x -C "$dir" --strip-components=4
echo "$(find "$dir" -name '*.py' | wc -l) engine files of $(git rev-parse --short "$rev") in $dir"
