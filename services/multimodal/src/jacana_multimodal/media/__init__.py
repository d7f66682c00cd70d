"""Encoding rendered frames (``encode``: the H.264 MP4, the thumbnail and the spritesheet) and
decoding uploaded reference images (``images``)."""
