#!/usr/bin/env bash
# Wheels the GPU machine lacks, for the phases that need more than torch and Triton:
# `online` (gateway + engine over gRPC), SmolLM2's parity (transformers reads its GGUF
# through `gguf`) and `video` (diffusers' Wan pipelines). Versions are this checkout's
# .venv's, so the device runs what CI tests; the files land in .whl/ (git-ignored,
# ~16 MB), which gpu_suite.sh installs when a call carries it (carry: .whl).
#
#   bench/gpu_wheels.sh
#
# Why each one: the gRPC stubs under libs/common/src/jacana_common/pb check at import that
# grpcio is at least the grpcio-tools that generated them (the machine's is older);
# grpc_health and grpc_reflection are not there; fastapi imports opentelemetry's API at
# import time; transformers wants `gguf` for a GGUF checkpoint; WanPipeline cleans prompts
# with ftfy (which needs wcwidth); the video settings need pydantic-settings (above).
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  grpcio grpcio-health-checking grpcio-reflection
  fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv
  annotated-types typing-inspection opentelemetry-api
  gguf
  diffusers ftfy wcwidth
)
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
pins=()
for name in "${PACKAGES[@]}"; do
  version=$(.venv/bin/python -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
  [ -n "$version" ] || { echo "$name is not in .venv (make bootstrap first)" >&2; exit 1; }
  pins+=("$name==$version")
done
rm -rf .whl
# The device runs CPython 3.12 on x86-64 glibc; pure-Python wheels match any of these.
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
du -sh .whl
