"""The model code runs without the service around it (as bench/embeddings_gpu.py uses it):
importing it pulls in neither settings nor gRPC."""

from __future__ import annotations

import subprocess
import sys

MODEL_CODE = ["service", "batcher", "embedder", "model_spec", "varlen"]
# jacana_common itself is fine (the model code shares its GEMM backends), its settings and
# gRPC modules are not.
SERVICE_ONLY = [
    "pydantic",
    "pydantic_settings",
    "grpc",
    "jacana_common.settings",
    "jacana_common.grpc_server",
]


def test_model_code_imports_no_settings_and_no_grpc():
    code = (
        "import sys\n"
        + "".join(f"import jacana_embeddings.{m}\n" for m in MODEL_CODE)
        + f"print(sorted(m for m in {SERVICE_ONLY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
