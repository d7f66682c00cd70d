"""What guards and carries every request around the handlers: :mod:`.auth` (bearer keys on
/v1/*), :mod:`.body_limit` (413 above the size limit), both pure ASGI middleware;
:mod:`.admission` (how many generation requests run at once, 429 beyond) and
:mod:`.disconnect` (a client that leaves cancels its work; the SSE response), used by the
handlers.
"""
