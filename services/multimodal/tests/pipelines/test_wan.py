"""WanVideoModel against diffusers' own pipelines on the tiny random Wan (CPU, float32)."""

from __future__ import annotations

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import WanImageToVideoPipeline, WanPipeline

from jacana_multimodal.pipelines import cards
from jacana_multimodal.pipelines.base import InvalidRenderRequest, RenderRequest
from jacana_multimodal.pipelines.wan import (
    WanVideoModel,
    default_device_and_dtype,
    frames_to_render,
    to_uint8,
)


def _request(**overrides) -> RenderRequest:
    fields = dict(
        prompt="a red fox runs across a snowy field",
        negative_prompt="blurry",
        width=64,
        height=64,
        seconds=2,
        fps=8,
        seed=7,
        num_inference_steps=4,
        guidance_scale=5.0,
    )
    return RenderRequest(**{**fields, **overrides})


def _no_progress(done: int, total: int) -> None:
    pass


@pytest.mark.parametrize(
    ("asked", "rendered"), [(1, 1), (2, 5), (5, 5), (6, 9), (16, 17), (80, 81), (81, 81)]
)
def test_frames_to_render_is_the_next_4k_plus_1(asked, rendered):
    assert frames_to_render(asked) == rendered


def test_render_shape_and_dtype(tiny_t2v):
    frames = tiny_t2v.render(_request(width=160, height=96), _no_progress)
    assert frames.shape == (16, 96, 160, 3) and frames.dtype == np.uint8
    assert frames.std() > 10  # noise, not a blank clip


def test_render_equals_the_plain_diffusers_pipeline(tiny_t2v, tiny_t2v_dir):
    """The oracle: diffusers' WanPipeline loaded on its own, called with the same arguments.
    Same CPU float32 ops in the same order, so the frames are bitwise equal."""
    request = _request()
    frames = tiny_t2v.render(request, _no_progress)

    reference = WanPipeline.from_pretrained(tiny_t2v_dir)
    reference.set_progress_bar_config(disable=True)
    expected = reference(
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        height=request.height,
        width=request.width,
        num_frames=17,  # 16 asked, Wan renders 4k + 1
        num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale,
        generator=torch.Generator().manual_seed(request.seed),
        output_type="np",
    ).frames[0]
    assert expected.shape == (17, 64, 64, 3)
    np.testing.assert_array_equal(frames, to_uint8(expected[:16]))


def test_seed_decides_the_frames(tiny_t2v):
    first = tiny_t2v.render(_request(seconds=1), _no_progress)
    again = tiny_t2v.render(_request(seconds=1), _no_progress)
    other = tiny_t2v.render(_request(seconds=1, seed=8), _no_progress)
    np.testing.assert_array_equal(first, again)
    assert np.abs(first.astype(int) - other.astype(int)).mean() > 5


def test_on_step_is_called_once_per_step(tiny_t2v):
    calls = []
    tiny_t2v.render(_request(seconds=1, num_inference_steps=5), lambda *c: calls.append(c))
    assert calls == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]


class Cancelled(Exception):
    pass


def test_an_exception_from_on_step_stops_the_render(tiny_t2v):
    request = _request(seconds=1)
    forwards = []
    hook = tiny_t2v.pipeline.transformer.register_forward_hook(lambda *_: forwards.append(1))

    def cancel_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Cancelled

    try:
        with pytest.raises(Cancelled):
            tiny_t2v.render(request, cancel_after_two)
        # Classifier-free guidance runs the transformer twice a step: two steps, four calls.
        assert len(forwards) == 4
    finally:
        hook.remove()
    # A cancelled render leaves nothing behind: the next one is what it would have been.
    np.testing.assert_array_equal(
        tiny_t2v.render(request, _no_progress), tiny_t2v.render(request, _no_progress)
    )


def test_text_to_video_refuses_a_reference_image(tiny_t2v):
    image = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(InvalidRenderRequest) as err:
        tiny_t2v.render(_request(input_reference=image), _no_progress)
    assert err.value.param == "input_reference"


def test_image_to_video_needs_a_reference_image(tiny_i2v):
    with pytest.raises(InvalidRenderRequest) as err:
        tiny_i2v.render(_request(), _no_progress)
    assert err.value.param == "input_reference"


def test_image_to_video_equals_the_plain_diffusers_pipeline(tiny_i2v, tiny_i2v_dir):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (96, 160, 3), dtype=np.uint8)
    request = _request(width=160, height=96, seconds=1, input_reference=image)
    frames = tiny_i2v.render(request, _no_progress)
    assert frames.shape == (8, 96, 160, 3) and frames.dtype == np.uint8

    reference = WanImageToVideoPipeline.from_pretrained(tiny_i2v_dir)
    reference.set_progress_bar_config(disable=True)
    expected = reference(
        image=PIL.Image.fromarray(image),
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        height=request.height,
        width=request.width,
        num_frames=9,
        num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale,
        generator=torch.Generator().manual_seed(request.seed),
        output_type="np",
    ).frames[0]
    np.testing.assert_array_equal(frames, to_uint8(expected[:8]))


def test_bfloat16_denoising_with_float32_decoding(tiny_t2v, tiny_t2v_dir, tiny_i2v_dir):
    """The GPU's precision split, run on the CPU: transformer and text encoder in bfloat16,
    VAE (and CLIP) in float32. On these random weights bfloat16 rounding moves pixels by
    about a tenth of a level on average (measured 0.11 of 255); 1.0 leaves room for other
    CPUs' kernels while still catching a render that went astray."""
    model = WanVideoModel.load(
        tiny_t2v_dir, cards.WAN21_T2V_TINY, device="cpu", dtype=torch.bfloat16
    )
    assert model.pipeline.transformer.dtype == model.pipeline.text_encoder.dtype == torch.bfloat16
    assert model.pipeline.vae.dtype == torch.float32
    request = _request(seconds=1)
    reduced = model.render(request, _no_progress).astype(int)
    full = tiny_t2v.render(request, _no_progress).astype(int)
    assert np.abs(reduced - full).mean() < 1.0
    i2v = WanVideoModel.load(tiny_i2v_dir, cards.WAN21_I2V_TINY, device="cpu", dtype=torch.bfloat16)
    assert i2v.pipeline.image_encoder.dtype == torch.float32


@pytest.mark.gpu
def test_tiny_renders_on_cuda_in_bfloat16(tiny_t2v_dir):
    device, dtype = default_device_and_dtype()
    assert device.type == "cuda" and dtype == torch.bfloat16
    model = WanVideoModel.load(tiny_t2v_dir, cards.WAN21_T2V_TINY, device=device, dtype=dtype)
    request = _request(width=128, height=128)
    frames = model.render(request, _no_progress)
    assert frames.shape == (16, 128, 128, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, model.render(request, _no_progress))
