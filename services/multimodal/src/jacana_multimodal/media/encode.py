"""Rendered frames -> the three artifacts of a video job: MP4, thumbnail, spritesheet.

Pure functions of their inputs, on the CPU. Frames are ``uint8`` RGB shaped
``[frames, height, width, 3]``, as ``VideoModel.render`` returns them.

The MP4 is H.264 (libx264, which PyAV's wheels bundle) in yuv420p, the one combination every
browser and player decodes. yuv420p halves chroma resolution, so odd sizes cannot be coded:
an odd width or height is padded by one edge-replicated pixel (the cards' sizes are even,
so served renders are never padded). Timestamps count frames (time base ``1/fps``), so the
container's duration is exactly ``frames / fps``. The ``moov`` index goes first
(``+faststart``) so a browser can start playing before the whole file has arrived; the
muxer does that by re-reading its output by name, hence the temporary file.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import PIL.Image

# x264's constant-quality mode: 18 is near visually lossless, and a 5 s 832x480 clip stays
# a few megabytes.
H264_CRF = 18
THUMBNAIL_QUALITY = 80  # WebP, lossy
SPRITESHEET_QUALITY = 85  # JPEG


def _check_frames(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(
            f"frames must be uint8 [frames, height, width, 3], got {frames.dtype} {frames.shape}"
        )
    if frames.shape[0] == 0:
        raise ValueError("no frames to encode")


def _pad_to_even(frames: np.ndarray) -> np.ndarray:
    _, height, width, _ = frames.shape
    pad = ((0, 0), (0, height % 2), (0, width % 2), (0, 0))
    return np.pad(frames, pad, mode="edge") if height % 2 or width % 2 else frames


def encode_mp4(frames: np.ndarray, fps: int, out: BinaryIO) -> None:
    """Write ``frames`` ([F, H, W, 3] uint8) as an H.264 MP4 at ``fps`` to ``out``.

    Lasts exactly ``F / fps`` seconds. Odd dimensions are padded up to even (see the module
    docstring).
    """
    _check_frames(frames)
    if fps < 1:
        raise ValueError(f"fps must be at least 1, got {fps}")
    frames = _pad_to_even(frames)
    _, height, width, _ = frames.shape
    with tempfile.TemporaryDirectory(prefix="jacana-mp4-") as tmp:
        path = Path(tmp) / "video.mp4"
        with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as c:
            stream = c.add_stream("libx264", rate=fps, options={"crf": str(H264_CRF)})
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for index, frame in enumerate(frames):
                video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
                video_frame.pts = index  # in the stream's time base, 1/fps
                c.mux(stream.encode(video_frame))
            c.mux(stream.encode())  # flush the encoder's delayed frames
        with path.open("rb") as src:
            shutil.copyfileobj(src, out)


def encode_thumbnail(frames: np.ndarray) -> bytes:
    """The first frame as a WebP image at the video's size."""
    _check_frames(frames)
    buf = io.BytesIO()
    PIL.Image.fromarray(frames[0]).save(buf, format="WEBP", quality=THUMBNAIL_QUALITY)
    return buf.getvalue()


def spritesheet_indices(num_frames: int, count: int) -> np.ndarray:
    """``min(count, num_frames)`` frame indices spread evenly from first to last."""
    count = min(count, num_frames)
    return np.linspace(0, num_frames - 1, count).round().astype(int)


def encode_spritesheet(
    frames: np.ndarray, *, columns: int = 4, count: int = 16, max_tile_side: int = 256
) -> bytes:
    """A JPEG grid of ``count`` evenly spaced frames, left to right then top to bottom.

    Tiles are the frames scaled down (never up) so their longer side is at most
    ``max_tile_side``; the sheet is ``columns`` tiles wide (fewer when there are fewer
    frames) and ``ceil(tiles / columns)`` tall, unused cells black.
    """
    _check_frames(frames)
    if columns < 1 or count < 1 or max_tile_side < 1:
        raise ValueError("columns, count and max_tile_side must be at least 1")
    indices = spritesheet_indices(frames.shape[0], count)
    _, height, width, _ = frames.shape
    scale = min(1.0, max_tile_side / max(height, width))
    tile_w, tile_h = max(1, round(width * scale)), max(1, round(height * scale))
    cols = min(columns, len(indices))
    rows = -(-len(indices) // cols)
    sheet = PIL.Image.new("RGB", (cols * tile_w, rows * tile_h))
    for n, index in enumerate(indices):
        tile = PIL.Image.fromarray(frames[index])
        if tile.size != (tile_w, tile_h):
            tile = tile.resize((tile_w, tile_h), PIL.Image.Resampling.LANCZOS)
        sheet.paste(tile, ((n % cols) * tile_w, (n // cols) * tile_h))
    buf = io.BytesIO()
    sheet.save(buf, format="JPEG", quality=SPRITESHEET_QUALITY)
    return buf.getvalue()
