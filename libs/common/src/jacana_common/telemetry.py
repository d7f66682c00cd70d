"""Trace-context propagation over gRPC metadata.

OpenTelemetry is optional: when ``opentelemetry`` is installed and a tracer provider is
configured, the W3C ``traceparent`` travels from gateway to services in call metadata;
otherwise these helpers are no-ops.
"""

from __future__ import annotations

from collections.abc import Mapping


def outgoing_metadata(extra: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Metadata for an outgoing gRPC call carrying the current trace context."""
    carrier: dict[str, str] = dict(extra or {})
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return list(carrier.items())
    inject(carrier)
    return [(k.lower(), v) for k, v in carrier.items()]


def incoming_context(metadata: Mapping[str, str] | None):
    """The OpenTelemetry context carried by an incoming call's metadata (or None)."""
    try:
        from opentelemetry.propagate import extract
    except ImportError:
        return None
    return extract(dict(metadata or {}))
