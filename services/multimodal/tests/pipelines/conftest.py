"""The tiny Wan models, built once per session into a temporary cache directory.

Building takes about a second each and loading a fraction of one; the loaded text-to-video
model is shared read-only by the render tests (a render leaves no state behind).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jacana_multimodal.pipelines import cards
from jacana_multimodal.pipelines.tiny_wan import ensure_tiny_wan
from jacana_multimodal.pipelines.wan import WanVideoModel


@pytest.fixture(scope="session")
def wan_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wan-cache")


@pytest.fixture(scope="session")
def tiny_t2v_dir(wan_cache) -> Path:
    return ensure_tiny_wan(wan_cache)


@pytest.fixture(scope="session")
def tiny_i2v_dir(wan_cache) -> Path:
    return ensure_tiny_wan(wan_cache, image_to_video=True)


@pytest.fixture(scope="session")
def tiny_t2v(tiny_t2v_dir) -> WanVideoModel:
    return WanVideoModel.load(tiny_t2v_dir, cards.WAN21_T2V_TINY, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_i2v(tiny_i2v_dir) -> WanVideoModel:
    return WanVideoModel.load(tiny_i2v_dir, cards.WAN21_I2V_TINY, device="cpu", dtype=torch.float32)
