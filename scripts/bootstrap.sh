#!/usr/bin/env bash
# Create or update .venv with everything Jacana needs: torch, the pinned requirements,
# the local distributions (editable) and the model packages (requirements/models.txt).
#
# Safe to run again: a stamp keyed on the requirement files, the local pyproject.toml
# files and this script makes a run with nothing changed return at once.
#
# Usage: bash scripts/bootstrap.sh [--force]
# Environment: JACANA_VENV (default .venv), JACANA_PYTHON (interpreter to build it with),
#              JACANA_TORCH_VERSION (default: TORCH_VERSION below).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="${JACANA_VENV:-$ROOT/.venv}"
TORCH_VERSION="${JACANA_TORCH_VERSION:-2.13.0}"
PIP_VERSION="26.3"
STAMP="$VENV/.jacana-bootstrap"
REQUIRED_DISTS=(libs/common services/engine services/gateway)
NEEDED_GIB=8  # free disk a build needs (see the check before it)

# Debian packages the suite needs, as "binary:package"; installed only when the binary is
# missing (and we are root). ffmpeg decodes uploaded audio for the speech-to-text service;
# espeak-ng and sox synthesize the speech its tests transcribe; redis-server is the job
# broker and store (libs/jobs).
APT_NEEDS=(ffmpeg:ffmpeg espeak-ng:espeak-ng sox:sox redis-server:redis-server)

log() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg" ;;
    esac
done

# Every distribution under libs/ and services/ is installed editable.
local_dists() {
    local d
    for d in libs/*/ services/*/; do
        [[ -f "$d/pyproject.toml" ]] && printf '%s\n' "${d%/}"
    done
    return 0
}

ensure_apt_packages() {
    local entry missing=()
    for entry in "${APT_NEEDS[@]}"; do
        command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        die "missing system packages: ${missing[*]} (install them, then run this again)"
    fi
    log "installing system packages: ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

find_python() {
    local candidate
    for candidate in ${JACANA_PYTHON:-} python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    die "Python 3.11 or newer not found (tried: ${JACANA_PYTHON:-} python3.11 python3)"
}

fingerprint() {
    {
        cat requirements/*.txt scripts/bootstrap.sh
        local d
        while read -r d; do printf '%s\n' "$d"; cat "$d/pyproject.toml"; done < <(local_dists)
        printf 'torch=%s\n' "$TORCH_VERSION"
        "$VENV/bin/python" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

installed_version() {
    "$VENV/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' \
        "$1" 2>/dev/null || true
}

for d in "${REQUIRED_DISTS[@]}"; do
    [[ -f "$d/pyproject.toml" ]] || die "$d/pyproject.toml is missing"
done
ensure_apt_packages

# A venv that cannot run, or runs a Python older than 3.11, is rebuilt.
if [[ -e "$VENV" ]] && ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    [[ -f "$VENV/pyvenv.cfg" ]] || die "$VENV exists but is not a virtual environment"
    log "removing unusable virtual environment $VENV"
    rm -rf "$VENV"
fi

if [[ $force -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$(fingerprint)" ]]; then
    log "up to date ($VENV)"
    exit 0
fi

# A new environment needs ~8 GiB (torch, Triton, the model packages and their joined
# files); a full disk otherwise fails halfway through some pip install with a bare
# "Errno 28".
free_kib="$(df -Pk "$ROOT" | awk 'NR == 2 {print $4}')"
if [[ ! -e "$VENV" && -n "$free_kib" ]] && ((free_kib < NEEDED_GIB * 1024 * 1024)); then
    die "only $((free_kib / 1024)) MiB free on $(df -P "$ROOT" | awk 'NR == 2 {print $6}'); building $VENV needs about ${NEEDED_GIB} GiB"
fi

started=$SECONDS
if [[ ! -x "$VENV/bin/python" ]]; then
    python="$(find_python)"
    log "creating $VENV with $python ($("$python" -V 2>&1))"
    "$python" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip)

log "installing pip==$PIP_VERSION"
"${pip[@]}" install -qq --upgrade "pip==$PIP_VERSION"

torch="$(installed_version torch)"
if [[ -z "$torch" ]]; then
    # --no-index: only the local wheel directories (pip's find-links) are looked at, so the
    # multi-GB build from the index is never pulled by accident. Its dependencies are pinned
    # in requirements/runtime.txt and come with the next step.
    log "installing torch==$TORCH_VERSION"
    if "${pip[@]}" install -qq --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null; then
        log "took torch==$TORCH_VERSION from a local wheel"
    else
        log "no local torch==$TORCH_VERSION wheel; installing torch from the package index (large)"
        "${pip[@]}" install -qq -c requirements/runtime.txt torch
    fi
    torch="$(installed_version torch)"
else
    log "keeping installed torch==$torch"
fi

# A CUDA build of torch comes with its own Triton; otherwise take the pinned one.
triton="$(installed_version triton)"
if [[ -z "$triton" ]]; then
    log "installing requirements/triton.txt"
    "${pip[@]}" install -qq -r requirements/triton.txt
    triton="$(installed_version triton)"
fi

# Nothing below may replace torch or triton.
constraint="$VENV/jacana-torch-constraint.txt"
printf 'torch==%s\ntriton==%s\n' "$torch" "$triton" >"$constraint"

mapfile -t dists < <(local_dists)
editables=()
for d in "${dists[@]}"; do editables+=(-e "$d"); done
log "installing requirements/dev.txt and ${dists[*]} (editable)"
"${pip[@]}" install -qq -c "$constraint" -r requirements/dev.txt "${editables[@]}"

log "installing model packages from requirements/models.txt (--no-deps)"
"${pip[@]}" install -qq --no-deps -r requirements/models.txt
# Models split over several packages are joined into a git-ignored cache and their sha256
# checked once here, so a broken download fails now rather than in a test.
"$VENV/bin/python" -c 'from jacana_engine.assets.model_packages import qwen_coder_0_5b_path as p; p()' ||
    die "the Qwen2.5-Coder-0.5B parts (requirements/models.txt) do not join into the expected file"
"$VENV/bin/python" -c 'from jacana_asr.model_packages import whisper_base_path as p; p()' ||
    die "the Whisper base parts (requirements/models.txt) do not join into the expected checkpoint"

# Model packages declare dependencies they do not need (see models*.txt; models-large.txt
# is installed by the make targets that need it); ignore those.
model_pkgs="$(sed -e 's/#.*//' -e 's/[=<>!~ ].*//' -e '/^$/d' requirements/models*.txt | tr '\n' '|')"
problems="$("${pip[@]}" check 2>&1 | grep -v -i -E "^(${model_pkgs%|}) " | grep -v '^No broken' || true)"
[[ -z "$problems" ]] || die "inconsistent environment:"$'\n'"$problems"

[[ "$(installed_version torch)" == "$torch" ]] || die "torch changed during install (expected $torch)"
fingerprint >"$STAMP"
log "done in $((SECONDS - started))s (torch $torch, $("$VENV/bin/python" -V))"
