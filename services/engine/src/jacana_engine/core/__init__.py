"""The engine core: request state, the scheduler, the synchronous step loop and its asyncio
front, outputs and stats. Host-side only; tensors live in ``worker/``."""
