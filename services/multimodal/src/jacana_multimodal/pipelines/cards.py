"""The static cards of the video architectures Jacana serves.

Pure data (no torch, no diffusers): the service validates requests against a card without
loading weights, so it imports this module and never the pipelines. Each card here is a
template whose ``id`` is the architecture's; the registry stamps the configured model id
onto it.

Wan 2.1 facts the cards encode:
- Sizes are multiples of 16 (the VAE downsamples space by 8, the transformer patches 2x2).
- The model has no frame-rate input; it was trained on 81-frame clips at 16 fps. ``max_fps``
  is therefore 16: a higher rate would only ask for more frames of the same motion.
- A clip of ``seconds * fps`` frames is rendered as the next ``4k + 1`` frames (the VAE
  compresses time by 4 after the first frame) and trimmed; 5 s at 16 fps is 80 -> 81.
"""

from __future__ import annotations

from jacana_multimodal.pipelines.base import ModelCard

# 832x480 and its portrait twin are the 480P sizes (Wan2.1-T2V-1.3B, Wan2.1-I2V-14B-480P);
# 1280x720 and 720x1280 the 720P ones (the 14B checkpoints). Which of them a given
# checkpoint renders well is the operator's concern: the card allows all four.
_WAN21_SIZES = ("832x480", "480x832", "1280x720", "720x1280")
_WAN21_SECONDS = ("1", "2", "3", "4", "5")

WAN21_T2V = ModelCard(
    id="wan2.1-t2v",
    architecture="wan2.1-t2v",
    sizes=_WAN21_SIZES,
    seconds=_WAN21_SECONDS,
    default_size="832x480",
    default_seconds="5",
    default_fps=16,
    default_steps=50,
    default_guidance_scale=5.0,
    max_fps=16,
    description="Wan 2.1 text-to-video (diffusers layout).",
)

WAN21_I2V = ModelCard(
    id="wan2.1-i2v",
    architecture="wan2.1-i2v",
    sizes=_WAN21_SIZES,
    seconds=_WAN21_SECONDS,
    default_size="832x480",
    default_seconds="5",
    default_fps=16,
    default_steps=50,
    default_guidance_scale=5.0,
    max_fps=16,
    image_to_video=True,
    description="Wan 2.1 image-to-video (diffusers layout); input_reference is the first frame.",
)

# The embedded tiny models (tiny_wan.py): the real Wan 2.1 architecture at toy width with
# random weights. Their frames are noise; they exist so that the whole stack runs, on a CPU,
# in tests and demos. 4 steps keep a 2 s clip under a second on a CPU; the fps cap is the
# generic one, since there is no trained motion to respect.
_TINY_SIZES = ("64x64", "128x128", "160x96", "96x160")
_TINY_SECONDS = ("1", "2", "3", "4")
_TINY_NOTE = "Random weights: the frames are noise. For tests and demos of the serving stack."

WAN21_T2V_TINY = ModelCard(
    id="wan2.1-t2v-tiny",
    architecture="wan2.1-t2v-tiny",
    sizes=_TINY_SIZES,
    seconds=_TINY_SECONDS,
    default_size="128x128",
    default_seconds="2",
    default_fps=8,
    default_steps=4,
    default_guidance_scale=5.0,
    random_weights=True,
    description=f"Wan 2.1 text-to-video at toy size. {_TINY_NOTE}",
)

WAN21_I2V_TINY = ModelCard(
    id="wan2.1-i2v-tiny",
    architecture="wan2.1-i2v-tiny",
    sizes=_TINY_SIZES,
    seconds=_TINY_SECONDS,
    default_size="128x128",
    default_seconds="2",
    default_fps=8,
    default_steps=4,
    default_guidance_scale=5.0,
    image_to_video=True,
    random_weights=True,
    description=f"Wan 2.1 image-to-video at toy size. {_TINY_NOTE}",
)
