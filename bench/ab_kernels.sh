#!/usr/bin/env bash
# The engine's kernels as revision REV (default HEAD) has them, in .xfer/ab_kernels, for
# `bench/gpu_suite.sh ab` to time the working tree against (carry .xfer/ab_kernels):
#
#   bench/ab_kernels.sh cbe4cbe
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
dir=.xfer/ab_kernels
rm -rf "$dir" && mkdir -p "$dir"
grep -qx '/.xfer/' .git/info/exclude 2>/dev/null || echo '/.xfer/' >>.git/info/exclude
for f in $(git ls-tree --name-only "$rev" services/engine/src/jacana_engine/kernels/); do
  case "$f" in *.py) git show "$rev:$f" >"$dir/$(basename "$f")" ;; esac
done
echo "$(ls "$dir" | wc -l) kernel files of $(git rev-parse --short "$rev") in $dir"
