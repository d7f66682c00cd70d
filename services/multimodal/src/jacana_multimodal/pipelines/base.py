"""The interface every video model implements, and what a render is asked for.

A ``VideoModel`` is built once per worker process and renders one request at a time (the
worker runs with concurrency 1). Its ``card`` is static: the service validates requests
against it without loading any weights, so the checks here are pure functions of the
card. Frames come back as ``uint8`` arrays shaped ``[frames, height, width, 3]`` (RGB).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class InvalidRenderRequest(ValueError):
    """A request this model cannot render as asked; ``param`` names the field to blame
    (OpenAI's name: ``prompt``, ``size``, ``seconds``, ``input_reference``...)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class ModelCard:
    """What a model offers, as ``/v1/models`` and the request checks see it."""

    id: str
    architecture: str
    sizes: tuple[str, ...]  # "WIDTHxHEIGHT"
    seconds: tuple[str, ...]  # whole seconds, as OpenAI spells them ("4")
    default_size: str
    default_seconds: str
    default_fps: int
    default_steps: int
    default_guidance_scale: float
    max_steps: int = 100
    max_fps: int = 30
    max_prompt_chars: int = 2000
    image_to_video: bool = False
    random_weights: bool = False
    description: str = ""


@dataclass(frozen=True)
class RenderRequest:
    """One render, every default already filled in from the card.

    ``num_frames`` is ``seconds * fps``: the clip's duration is exactly ``seconds``.
    ``input_reference`` is the first frame to start from (RGB uint8 ``[H, W, 3]``), or None.
    """

    prompt: str
    negative_prompt: str
    width: int
    height: int
    seconds: int
    fps: int
    seed: int
    num_inference_steps: int
    guidance_scale: float
    input_reference: np.ndarray | None = field(default=None, compare=False)

    @property
    def num_frames(self) -> int:
        return self.seconds * self.fps


# Called after each denoising step with (steps done, steps in all). It may raise to stop
# the render (a cancelled job): the exception propagates out of ``render``.
StepCallback = Callable[[int, int], None]


class VideoModel(Protocol):
    """A loaded video model. ``render`` is deterministic for a given request (seed
    included) on one device and dtype."""

    card: ModelCard

    def render(self, request: RenderRequest, on_step: StepCallback) -> np.ndarray:
        """Frames ``[request.num_frames, height, width, 3]`` uint8 RGB."""
        ...
