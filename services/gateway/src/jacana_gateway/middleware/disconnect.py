"""Stop working for a client that has gone away.

ASGI servers do not cancel a request's task when its client disconnects, and Starlette's
``StreamingResponse`` only watches for the disconnect on older ASGI spec versions (on 2.4+
it waits for a failing ``send``, which never comes while the engine is still thinking).
:func:`cancel_on_disconnect` watches ``receive`` for ``http.disconnect`` itself and cancels
the running task, so whatever it awaits — an engine call, a stream read — is interrupted
and its ``finally`` blocks run (that is where engine calls get cancelled). The
non-streaming handlers use it, and so does :class:`WatchedStreamingResponse` (SSE streams,
downloads).

Must be entered after the request body has been read: from then on the only message
``receive`` can deliver is ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from jacana_gateway.errors import ClientDisconnected


@contextlib.asynccontextmanager
async def cancel_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Run the block; if the client disconnects meanwhile, cancel it and raise
    :class:`ClientDisconnected` (a cancellation from anywhere else propagates unchanged)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("cancel_on_disconnect needs a running asyncio task")
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        task.cancel()

    watcher = asyncio.create_task(watch())
    # Not awaited on exit (that could swallow a cancellation meant for this task); a
    # failure of ``receive`` is retrieved here so that it is not reported as unhandled.
    watcher.add_done_callback(lambda t: t.cancelled() or t.exception())
    try:
        yield
    except asyncio.CancelledError:
        if gone.is_set() and task.uncancel() == 0:
            raise ClientDisconnected from None
        raise
    finally:
        watcher.cancel()


class WatchedStreamingResponse(StreamingResponse):
    """A streaming response that stops (and closes its iterator) when the client leaves.

    ``on_close`` callbacks run exactly once when the response ends, however it ends.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: list[Callable[[], None]],
        headers: dict[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        super().__init__(content, headers=headers, media_type=media_type)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with cancel_on_disconnect(receive):
                await self.stream_response(send)
        except (ClientDisconnected, OSError):
            pass
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            for callback in self._on_close:
                callback()


class EventStreamResponse(WatchedStreamingResponse):
    """``text/event-stream``, unbuffered, that stops when the client leaves."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: list[Callable[[], None]],
        headers: dict[str, str] | None = None,
    ) -> None:
        no_buffering = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, on_close, headers=no_buffering | (headers or {}))
