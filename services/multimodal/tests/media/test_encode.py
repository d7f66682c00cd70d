"""MP4, thumbnail and spritesheet, each read back with an independent decoder (PyAV, Pillow)."""

from __future__ import annotations

import io

import av
import numpy as np
import PIL.Image
import pytest

from jacana_multimodal.media.encode import (
    encode_mp4,
    encode_spritesheet,
    encode_thumbnail,
    spritesheet_indices,
)


def moving_gradient(num_frames: int, height: int, width: int) -> np.ndarray:
    """Smooth frames (a diagonal gradient sliding right) that H.264 codes almost exactly."""
    y, x = np.mgrid[0:height, 0:width]
    frames = [
        np.stack([(x + 4 * t) % 256, y * 255 // max(1, height - 1), np.full_like(x, 128)], -1)
        for t in range(num_frames)
    ]
    return np.asarray(frames, dtype=np.uint8)


def solid_frames(num_frames: int, height: int, width: int) -> np.ndarray:
    """Frame i is one flat gray level, 10 * i, so a decoded pixel tells which frame it was."""
    levels = (np.arange(num_frames) * 10).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (num_frames, height, width, 3)).copy()


def decode(data: bytes):
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = np.asarray([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
        return stream, container.duration, frames


@pytest.mark.parametrize(("num_frames", "fps"), [(16, 8), (81, 16), (1, 8), (30, 24)])
def test_mp4_round_trip(num_frames, fps):
    frames = moving_gradient(num_frames, 96, 160)
    out = io.BytesIO()
    encode_mp4(frames, fps, out)
    stream, duration_us, decoded = decode(out.getvalue())

    assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
    assert (stream.width, stream.height) == (160, 96)
    assert stream.average_rate == fps
    assert decoded.shape == frames.shape
    # Exact to the millisecond (the mp4 muxer rounds the last frame's duration to its own
    # timescale), far inside the one-frame contract.
    assert duration_us / 1e6 == pytest.approx(num_frames / fps, abs=1e-3)
    assert float(stream.duration * stream.time_base) == pytest.approx(num_frames / fps, abs=1e-3)
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 3


def test_mp4_frames_keep_their_order():
    frames = solid_frames(12, 64, 64)
    out = io.BytesIO()
    encode_mp4(frames, 8, out)
    _, _, decoded = decode(out.getvalue())
    np.testing.assert_allclose(decoded.mean(axis=(1, 2, 3)), frames.mean(axis=(1, 2, 3)), atol=2)


def test_mp4_puts_the_index_first():
    out = io.BytesIO()
    encode_mp4(solid_frames(4, 32, 32), 8, out)
    data = out.getvalue()
    assert data[4:8] == b"ftyp" and 0 < data.find(b"moov") < data.find(b"mdat")


def test_mp4_pads_odd_sizes_to_even():
    out = io.BytesIO()
    encode_mp4(moving_gradient(5, 63, 101), 8, out)
    stream, _, decoded = decode(out.getvalue())
    assert (stream.width, stream.height) == (102, 64) and len(decoded) == 5


@pytest.mark.parametrize(
    "frames",
    [np.zeros((0, 8, 8, 3), np.uint8), np.zeros((2, 8, 8, 3), np.float32), np.zeros((8, 8, 3))],
)
def test_encoders_reject_what_is_not_a_clip(frames):
    with pytest.raises(ValueError):
        encode_mp4(frames, 8, io.BytesIO())
    with pytest.raises(ValueError):
        encode_thumbnail(frames)


def test_thumbnail_is_the_first_frame_as_webp():
    frames = moving_gradient(6, 96, 160)
    frames[1:] = 255 - frames[1:]
    image = PIL.Image.open(io.BytesIO(encode_thumbnail(frames)))
    assert image.format == "WEBP" and image.size == (160, 96)
    decoded = np.asarray(image.convert("RGB"), dtype=int)
    assert np.abs(decoded - frames[0]).mean() < 4
    assert np.abs(decoded - frames[-1]).mean() > 50


def test_spritesheet_indices_are_evenly_spaced():
    assert spritesheet_indices(16, 4).tolist() == [0, 5, 10, 15]
    assert spritesheet_indices(81, 5).tolist() == [0, 20, 40, 60, 80]
    assert spritesheet_indices(3, 10).tolist() == [0, 1, 2]


def test_spritesheet_is_a_jpeg_grid_of_the_chosen_frames():
    frames = solid_frames(16, 48, 64)
    sheet = PIL.Image.open(io.BytesIO(encode_spritesheet(frames, columns=4, count=6)))
    assert sheet.format == "JPEG" and sheet.size == (4 * 64, 2 * 48)
    pixels = np.asarray(sheet.convert("L"), dtype=int)
    # Cell centres, left to right then top to bottom; the last two cells are empty (black).
    centres = [pixels[24 + 48 * (n // 4), 32 + 64 * (n % 4)] for n in range(8)]
    expected = [10 * i for i in spritesheet_indices(16, 6)] + [0, 0]
    assert np.abs(np.array(centres) - expected).max() <= 3


def test_spritesheet_tiles_shrink_to_the_side_limit():
    sheet = encode_spritesheet(solid_frames(4, 480, 832), columns=2, count=4, max_tile_side=208)
    assert PIL.Image.open(io.BytesIO(sheet)).size == (2 * 208, 2 * 120)


def test_spritesheet_of_fewer_frames_than_columns_is_one_row():
    sheet = encode_spritesheet(solid_frames(2, 32, 32), columns=4, count=8)
    assert PIL.Image.open(io.BytesIO(sheet)).size == (2 * 32, 32)
