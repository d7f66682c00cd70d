"""Reference images: decoded, fitted to the render size, and refused with the right param."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image
import pytest

from jacana_multimodal.media.images import decode_reference_image
from jacana_multimodal.pipelines.base import InvalidRenderRequest


def encoded(image: PIL.Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def stripes(width: int, height: int) -> PIL.Image.Image:
    """Three vertical bands: red, green, blue."""
    array = np.zeros((height, width, 3), np.uint8)
    third = width // 3
    array[:, :third, 0] = array[:, third : 2 * third, 1] = array[:, 2 * third :, 2] = 255
    return PIL.Image.fromarray(array)


def test_same_size_png_is_exact():
    array = np.random.default_rng(0).integers(0, 256, (96, 160, 3), dtype=np.uint8)
    decoded = decode_reference_image(encoded(PIL.Image.fromarray(array)), 160, 96)
    assert decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP", "PNG"])
def test_wide_image_is_scaled_and_centre_cropped(fmt):
    # 300x100 into a square: scaled to 64 tall, the middle 64 columns kept -- the green band.
    decoded = decode_reference_image(encoded(stripes(300, 100), fmt), 64, 64)
    assert decoded.shape == (64, 64, 3)
    inner = decoded[:, 16:48].reshape(-1, 3).mean(axis=0)
    assert inner[1] > 200 and inner[0] < 40 and inner[2] < 40


def test_tall_target_keeps_the_middle_of_a_square_image():
    decoded = decode_reference_image(encoded(stripes(90, 90)), 96, 160)
    assert decoded.shape == (160, 96, 3)
    # Scaled to 160 tall (160 wide), the middle 96 columns: mostly green, red and blue edges.
    assert decoded[:, 48, 1].min() > 200
    assert decoded[:, 2, 0].min() > 200 and decoded[:, 93, 2].min() > 200


def test_transparency_becomes_white():
    image = PIL.Image.new("RGBA", (32, 32), (255, 0, 0, 0))
    decoded = decode_reference_image(encoded(image), 32, 32)
    assert (decoded == 255).all()


def test_grayscale_and_palette_images_become_rgb():
    gray = decode_reference_image(encoded(PIL.Image.new("L", (16, 16), 77)), 16, 16)
    palette = decode_reference_image(
        encoded(PIL.Image.new("RGB", (16, 16), (9, 99, 199)).convert("P")), 16, 16
    )
    assert (gray == 77).all() and gray.shape == (16, 16, 3)
    assert palette.shape == (16, 16, 3) and abs(int(palette[..., 2].mean()) - 199) <= 8


def test_exif_orientation_is_applied():
    # A 40x20 image stored sideways with "rotate 90" in its EXIF shows as 20x40.
    image = stripes(40, 20)
    exif = PIL.Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 clockwise to view
    buf = io.BytesIO()
    image.save(buf, format="JPEG", exif=exif)
    decoded = decode_reference_image(buf.getvalue(), 20, 40)
    top, bottom = decoded[2].mean(axis=0), decoded[-3].mean(axis=0)
    assert top[0] > 200 and bottom[2] > 200  # red band on top, blue at the bottom


NOISE_PNG = encoded(
    PIL.Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"this is not an image", "not an image"),
        (NOISE_PNG[: len(NOISE_PNG) // 2], "damaged or truncated"),
    ],
)
def test_bad_bytes_blame_input_reference(data, message):
    with pytest.raises(InvalidRenderRequest, match=message) as err:
        decode_reference_image(data, 64, 64)
    assert err.value.param == "input_reference"


def test_too_many_pixels_are_refused_before_decoding():
    data = encoded(PIL.Image.new("RGB", (200, 100)))
    with pytest.raises(InvalidRenderRequest, match="too large") as err:
        decode_reference_image(data, 64, 64, max_pixels=200 * 100 - 1)
    assert err.value.param == "input_reference"
    assert decode_reference_image(data, 64, 64, max_pixels=200 * 100).shape == (64, 64, 3)
