"""Jacana's OpenAI-compatible HTTP gateway."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed distribution's version."""
    try:
        return metadata.version("jacana-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0"
