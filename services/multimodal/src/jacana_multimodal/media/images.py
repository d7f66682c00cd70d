"""Uploaded reference images (``input_reference``) -> the first frame of a render.

A pure function of the upload's bytes and the target size. Everything wrong with the upload
is the client's error and comes back as ``InvalidRenderRequest(param="input_reference")``,
never as a Pillow exception.
"""

from __future__ import annotations

import io

import numpy as np
import PIL.Image
import PIL.ImageOps

from jacana_multimodal.pipelines.base import InvalidRenderRequest

# The largest upload decoded, in pixels (width * height): 8K UHD and then some. The header
# is read before any pixel is, so a bigger image is refused without the memory it would
# take (an RGB 50 MP image is 150 MB decoded).
MAX_REFERENCE_PIXELS = 50_000_000

_PARAM = "input_reference"


def decode_reference_image(
    data: bytes, width: int, height: int, *, max_pixels: int = MAX_REFERENCE_PIXELS
) -> np.ndarray:
    """Decode ``data`` (any format Pillow reads: PNG, JPEG, WebP...) to ``[height, width, 3]``
    uint8 RGB.

    The image is turned upright by its EXIF orientation, flattened onto white if it has
    transparency, scaled to cover the target (aspect ratio kept) and center-cropped to
    exactly ``width x height``: nothing is stretched; what sticks out is cut off. For an
    animation, the first frame.
    """
    if not data:
        raise InvalidRenderRequest("input_reference is empty", param=_PARAM)
    try:
        image = PIL.Image.open(io.BytesIO(data))
    except PIL.Image.DecompressionBombError:
        raise _too_large(None, max_pixels) from None
    except (PIL.UnidentifiedImageError, OSError, ValueError):
        raise InvalidRenderRequest(
            "input_reference is not an image Jacana can read (PNG, JPEG, WebP...)", param=_PARAM
        ) from None
    with image:
        if image.width * image.height > max_pixels:
            raise _too_large(image.size, max_pixels)
        try:
            image.load()
            image = PIL.ImageOps.exif_transpose(image)
            rgb = _flatten(image)
        except (OSError, ValueError, SyntaxError):
            # Pillow's decoders report truncated or corrupt data with any of these.
            raise InvalidRenderRequest(
                "input_reference is a damaged or truncated image", param=_PARAM
            ) from None
    fitted = PIL.ImageOps.fit(rgb, (width, height), method=PIL.Image.Resampling.LANCZOS)
    return np.asarray(fitted, dtype=np.uint8).copy()


def _flatten(image: PIL.Image.Image) -> PIL.Image.Image:
    """RGB, with any transparency composited over white."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PIL.Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _too_large(size: tuple[int, int] | None, max_pixels: int) -> InvalidRenderRequest:
    shown = f" ({size[0]}x{size[1]})" if size else ""
    return InvalidRenderRequest(
        f"input_reference is too large{shown}: at most {max_pixels:,} pixels", param=_PARAM
    )
