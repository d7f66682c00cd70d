#!/usr/bin/env bash
# Model files for the GPU machine, which a single call cannot carry (64 MiB per call,
# the repository's own files included).
#
# Here:      bench/gpu_assets.sh pack NAME FILE_OR_DIR
#   splits FILE (or a tar of DIR) into .xfer/NAME/part-NN of $JACANA_XFER_CHUNK_MIB MiB
#   (default 28) plus .xfer/NAME/meta (parts, sha256, kind); each device call then carries
#   a part or two and the meta file (carry: .xfer/NAME/part-00, .xfer/NAME/meta, …). What
#   a call carries and the tree share 64 MiB: with .whl/ (10 MiB) beside it, a part of
#   32 MiB fits (SmolLM2's GGUF in three).
# There:     bench/gpu_assets.sh receive
#   appends what this call carried to /tmp/jacana-xfer (it survives between calls while
#   the machine stays warm), then assembles every asset whose parts are all there into
#   /tmp/jacana-assets/NAME (a directory again when it was packed from one), checks its
#   sha256, and prints `export` lines for the assets present:
#     eval "$(bench/gpu_assets.sh receive)"
#   ($JACANA_XFER_STORE and $JACANA_ASSETS_DIR move those two folders.)
#   JACANA_ASSET_<NAME> (upper case, other than letters and digits -> '_') names each
#   assembled file or directory; /tmp/jacana-assets also serves as JACANA_MODEL_CACHE
#   (jacana_engine.assets.model_packages), so pack cached models under their cache file names.
set -euo pipefail
CHUNK=$((${JACANA_XFER_CHUNK_MIB:-28} * 1024 * 1024))
cd "$(dirname "$0")/.."

pack() {
  local name=$1 src=$2 dir=.xfer/$1
  rm -rf "$dir" && mkdir -p "$dir"
  grep -qx '/.xfer/' .git/info/exclude 2>/dev/null || echo '/.xfer/' >>.git/info/exclude
  local kind=file total
  if [ -d "$src" ]; then
    tar -cf "$dir/asset.tar" -C "$src" . && src=$dir/asset.tar && kind=dir
  fi
  total=$(stat -c %s "$src")
  printf '%s %s %s\n' $(((total + CHUNK - 1) / CHUNK)) "$(sha256sum <"$src" | cut -d' ' -f1)" \
    "$kind" >"$dir/meta"
  split -b "$CHUNK" -d -a 2 "$src" "$dir/part-"
  rm -f "$dir/asset.tar"
  ls "$dir" | tr '\n' ' '
  echo
}

receive() {
  local store=${JACANA_XFER_STORE:-/tmp/jacana-xfer} assets=${JACANA_ASSETS_DIR:-/tmp/jacana-assets}
  mkdir -p "$store" "$assets"
  if [ -d .xfer ]; then cp -r .xfer/. "$store/"; fi
  for dir in "$store"/*/; do
    [ -d "$dir" ] || continue
    local name parts sha kind have out var
    name=$(basename "$dir")
    [ -f "$dir/meta" ] || continue
    read -r parts sha kind <"$dir/meta"
    have=$(find "$dir" -name 'part-*' | wc -l)
    out=$assets/$name
    if [ "$have" -lt "$parts" ]; then
      echo "echo '[assets] $name: $have of $parts parts here'"
      continue
    fi
    if [ ! -e "$out" ]; then
      cat "$dir"/part-* >"$out.tmp"
      if [ "$(sha256sum <"$out.tmp" | cut -d' ' -f1)" != "$sha" ]; then
        echo "echo '[assets] $name: sha256 mismatch, dropped'"
        rm -f "$out.tmp"
        continue
      fi
      if [ "$kind" = dir ]; then
        mkdir -p "$out" && tar -xf "$out.tmp" -C "$out" && rm -f "$out.tmp"
      else
        mv "$out.tmp" "$out"
      fi
    fi
    var=JACANA_ASSET_$(printf %s "$name" | tr -c 'A-Za-z0-9' '_' | tr 'a-z' 'A-Z')
    echo "export $var=$out"
    echo "echo '[assets] $name ready ($var)'"
  done
}

case "${1:-}" in
  pack) pack "$2" "$3" ;;
  receive) receive ;;
  *) echo "usage: $0 pack NAME FILE_OR_DIR | receive" >&2 && exit 2 ;;
esac
