"""From what a client asked to what a worker renders: the checks against the model card
and the job parameters both sides agree on.

``resolve`` is pure (a card and the raw fields in, ``VideoParams`` out, or
``InvalidVideoRequest`` naming the field); the service stores ``VideoParams.to_json()``
in the job record and the worker rebuilds the ``RenderRequest`` from it, so a re-delivered
render gets exactly the request the first attempt got (the seed included).
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

from jacana_multimodal.errors import InvalidVideoRequest
from jacana_multimodal.pipelines.base import ModelCard, RenderRequest

MAX_SEED = 2**63 - 1
MAX_GUIDANCE_SCALE = 50.0
MAX_NEGATIVE_PROMPT_CHARS = 2000


@dataclass(frozen=True)
class VideoParams:
    """A render as accepted: every default filled in. ``has_input`` says a reference image
    was stored for the job (``inputs/<job id>.png``)."""

    prompt: str
    negative_prompt: str
    seconds: int
    width: int
    height: int
    fps: int
    seed: int
    num_inference_steps: int
    guidance_scale: float
    has_input: bool = False
    remixed_from: str = ""

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VideoParams:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def remixed(self, source_id: str, prompt: str, card: ModelCard) -> VideoParams:
        """The same render under a new prompt (checked like a new one)."""
        return replace(self, prompt=check_prompt(prompt, card), remixed_from=source_id)

    def render_request(self, input_reference=None) -> RenderRequest:
        return RenderRequest(
            prompt=self.prompt,
            negative_prompt=self.negative_prompt,
            width=self.width,
            height=self.height,
            seconds=self.seconds,
            fps=self.fps,
            seed=self.seed,
            num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            input_reference=input_reference,
        )


def check_prompt(prompt: str, card: ModelCard) -> str:
    if not prompt.strip():
        raise InvalidVideoRequest("'prompt' must not be empty.", "prompt")
    if len(prompt) > card.max_prompt_chars:
        raise InvalidVideoRequest(
            f"'prompt' is {len(prompt)} characters long; {card.id} takes at most "
            f"{card.max_prompt_chars}.",
            "prompt",
        )
    return prompt


def _choice(value: str, allowed: tuple[str, ...], default: str, param: str, model: str) -> str:
    if not value:
        return default
    if value not in allowed:
        raise InvalidVideoRequest(
            f"Invalid '{param}' {value!r} for {model}; supported: {', '.join(allowed)}.", param
        )
    return value


def resolve(
    card: ModelCard,
    *,
    prompt: str,
    seconds: str = "",
    size: str = "",
    negative_prompt: str = "",
    seed: int | None = None,
    num_inference_steps: int | None = None,
    guidance_scale: float | None = None,
    fps: int | None = None,
    has_input: bool = False,
) -> VideoParams:
    """Check a request against ``card``; raise ``InvalidVideoRequest`` for the first field
    the model cannot serve."""
    check_prompt(prompt, card)
    chosen_seconds = _choice(seconds, card.seconds, card.default_seconds, "seconds", card.id)
    chosen_size = _choice(size, card.sizes, card.default_size, "size", card.id)
    width, height = (int(v) for v in chosen_size.split("x"))
    if len(negative_prompt) > MAX_NEGATIVE_PROMPT_CHARS:
        raise InvalidVideoRequest(
            f"'negative_prompt' takes at most {MAX_NEGATIVE_PROMPT_CHARS} characters.",
            "negative_prompt",
        )
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise InvalidVideoRequest(f"'seed' must be in [0, {MAX_SEED}].", "seed")
    steps = card.default_steps if num_inference_steps is None else num_inference_steps
    if not 1 <= steps <= card.max_steps:
        raise InvalidVideoRequest(
            f"'num_inference_steps' must be in [1, {card.max_steps}] for {card.id}.",
            "num_inference_steps",
        )
    guidance = card.default_guidance_scale if guidance_scale is None else guidance_scale
    if not 0.0 <= guidance <= MAX_GUIDANCE_SCALE:  # also refuses NaN
        raise InvalidVideoRequest(
            f"'guidance_scale' must be in [0, {MAX_GUIDANCE_SCALE:g}].", "guidance_scale"
        )
    chosen_fps = card.default_fps if fps is None else fps
    if not 1 <= chosen_fps <= card.max_fps:
        raise InvalidVideoRequest(f"'fps' must be in [1, {card.max_fps}] for {card.id}.", "fps")
    if has_input and not card.image_to_video:
        raise InvalidVideoRequest(
            f"{card.id} is a text-to-video model; it takes no 'input_reference'.",
            "input_reference",
        )
    return VideoParams(
        prompt=prompt,
        negative_prompt=negative_prompt,
        seconds=int(chosen_seconds),
        width=width,
        height=height,
        fps=chosen_fps,
        seed=secrets.randbelow(2**31) if seed is None else seed,
        num_inference_steps=steps,
        guidance_scale=float(guidance),
        has_input=has_input,
    )
