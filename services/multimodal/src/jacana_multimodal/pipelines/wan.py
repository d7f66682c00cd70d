"""Wan 2.1 text-to-video and image-to-video over diffusers' pipelines.

``WanVideoModel`` owns one diffusers pipeline -- ``WanPipeline``, or
``WanImageToVideoPipeline`` when the card says ``image_to_video`` -- with its weights on one
device. It is used by one render at a time (the worker runs with concurrency 1); nothing
in it is shared between renders except the weights.

Precision: the transformer and text encoder run in the caller's dtype (bfloat16 on a GPU);
the VAE and the CLIP image encoder stay in float32, as diffusers' own Wan examples load
them: they run once per render, cheap next to the denoising loop, and the VAE decode
writes the pixels, where rounding would show. On a CPU in float32 a render is bitwise the
plain ``from_pretrained(...)(...)`` call with the same arguments (the tests check it).

On CUDA, with ``cuda_compile``, the transformer's blocks are compiled (``torch.compile``,
once per model, during its first render of each new shape): the same function as
diffusers' eager blocks with fewer intermediate bfloat16 roundings, 1.26x faster per step
on an H100 at 832x480 (``bench/results/video_gpu/``). Attention stays PyTorch's SDPA,
which on Hopper already runs cuDNN's fused kernel. The frames become ``uint8`` on the
device, so a quarter of the float bytes cross to the host.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanPipeline
from transformers import CLIPVisionModel

from jacana_multimodal.pipelines.base import (
    InvalidRenderRequest,
    ModelCard,
    RenderRequest,
    StepCallback,
)

log = logging.getLogger(__name__)

# The Wan VAE keeps the first frame and compresses each following group of 4 frames into
# one latent frame, so a clip has 4k + 1 frames.
TEMPORAL_STRIDE = 4


def default_device_and_dtype() -> tuple[torch.device, torch.dtype]:
    """CUDA in bfloat16 when a GPU is present, else the CPU in float32."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def frames_to_render(num_frames: int) -> int:
    """The smallest ``4k + 1 >= num_frames`` (Wan renders only those lengths)."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be at least 1, got {num_frames}")
    return -(-(num_frames - 1) // TEMPORAL_STRIDE) * TEMPORAL_STRIDE + 1


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] -> uint8, rounded to nearest as diffusers' PIL output is."""
    return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)


def frames_to_uint8(video: torch.Tensor) -> np.ndarray:
    """``to_uint8`` of diffusers' ``"pt"`` frames ``[frames, 3, H, W]`` (float32 in [0, 1],
    on any device), computed where they are: ``[frames, H, W, 3]`` uint8 on the host.
    Bitwise ``to_uint8`` of the ``"np"`` frames: the same float32 product, rounded half
    to even by both."""
    pixels = (video * 255.0).round_().clamp_(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).contiguous().cpu().numpy()


def compile_on_cuda(transformer) -> bool:
    """``torch.compile`` each block of ``transformer`` in place when it is on CUDA; whether
    it did. Regional: every block has the same code, so one graph (guarded on shapes, not
    on weights) serves all of them and compiles once (about 10 s for Wan 2.1 1.3B on an
    H100); what lies outside the blocks runs once a forward and stays eager."""
    if transformer.device.type != "cuda":
        return False
    transformer.compile_repeated_blocks(fullgraph=True)
    return True


class WanVideoModel:
    """A ``VideoModel`` over a diffusers Wan 2.1 pipeline.

    ``pipeline`` is a ``WanPipeline``, or a ``WanImageToVideoPipeline`` when
    ``card.image_to_video``, already on its device (``load`` reads one from a directory).
    Requests are assumed already checked against ``card`` by the service, except the
    reference image, whose presence is checked here because rendering without it would
    silently be another task. ``cuda_compile``: compile the transformer's blocks in place
    if it is on CUDA (``self.compiled`` says whether that happened).
    """

    def __init__(
        self,
        pipeline: WanPipeline | WanImageToVideoPipeline,
        card: ModelCard,
        *,
        cuda_compile: bool = False,
    ) -> None:
        self.card = card
        self.pipeline = pipeline
        self.device = pipeline.transformer.device
        self.dtype = pipeline.transformer.dtype
        pipeline.set_progress_bar_config(disable=True)
        self.compiled = cuda_compile and compile_on_cuda(pipeline.transformer)

    @classmethod
    def load(
        cls,
        path: Path,
        card: ModelCard,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        cuda_compile: bool = False,
    ) -> WanVideoModel:
        """The model in the diffusers directory ``path`` (``model_index.json`` and the
        component folders) on ``device``: transformer and text encoder in ``dtype``, VAE
        and CLIP image encoder in float32."""
        pipeline_cls = WanImageToVideoPipeline if card.image_to_video else WanPipeline
        float32_parts = {"vae": AutoencoderKLWan.from_pretrained(path, subfolder="vae")}
        if card.image_to_video:
            float32_parts["image_encoder"] = CLIPVisionModel.from_pretrained(
                path, subfolder="image_encoder"
            )
        pipeline = pipeline_cls.from_pretrained(path, dtype=dtype, **float32_parts)
        model = cls(pipeline.to(device), card, cuda_compile=cuda_compile)
        compiled = ", transformer blocks compiled" if model.compiled else ""
        log.info("loaded %s from %s on %s (%s%s)", card.id, path, model.device, dtype, compiled)
        return model

    def render(self, request: RenderRequest, on_step: StepCallback) -> np.ndarray:
        """Frames ``[request.num_frames, height, width, 3]`` uint8 RGB.

        Renders ``frames_to_render(request.num_frames)`` frames and keeps the first
        ``request.num_frames``. ``on_step(done, total)`` runs after each denoising step; an
        exception it raises ends the render at once and propagates.
        """
        kwargs = {}
        if self.card.image_to_video:
            if request.input_reference is None:
                raise InvalidRenderRequest(
                    f"{self.card.id} renders from an image: input_reference is required",
                    param="input_reference",
                )
            # [H, W, 3] uint8; the pipeline resizes it to (height, width) itself.
            kwargs["image"] = PIL.Image.fromarray(request.input_reference)
        elif request.input_reference is not None:
            raise InvalidRenderRequest(
                f"{self.card.id} is text-to-video: it takes no input_reference",
                param="input_reference",
            )

        def step_end(pipeline, i: int, t: torch.Tensor, tensors: dict) -> dict:
            on_step(i + 1, pipeline.num_timesteps)
            return {}

        generator = torch.Generator(device=self.device).manual_seed(request.seed)
        with torch.inference_mode():
            output = self.pipeline(
                prompt=request.prompt,
                negative_prompt=request.negative_prompt or None,
                height=request.height,
                width=request.width,
                num_frames=frames_to_render(request.num_frames),
                num_inference_steps=request.num_inference_steps,
                guidance_scale=request.guidance_scale,
                generator=generator,
                output_type="pt",
                callback_on_step_end=step_end,
                callback_on_step_end_tensor_inputs=[],
                **kwargs,
            )
        # output.frames: [batch=1, frames, 3, height, width] float32 in [0, 1]
        return frames_to_uint8(output.frames[0, : request.num_frames])
