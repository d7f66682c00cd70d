"""Which sampler each row of a step takes, and the sampled ids on the device.

Owned by the model runner (one per runner). Rows whose parameters are plain sample in
the CUDA kernel (``sample/device_sampling.py``); rows with logit edits (penalties, bias,
``min_tokens``, a grammar mask) or on CPU go through the full :class:`Sampler`. The
choice is made per row from that row's parameters alone, so what a seeded request
samples never depends on what else shares the batch.
"""

from __future__ import annotations

import torch

from jacana_engine.sample.device_sampling import DeviceSampler
from jacana_engine.sample.logits_processors import PendingTokens
from jacana_engine.sample.sampler import RawLogprobs, RowLogprobs, Sampler
from jacana_engine.worker.host_to_device import index_on


class StepSampler:
    """Samples a step's rows: the CUDA fast path where it may, the full sampler elsewhere.

    ``device_sampler`` is None off CUDA (every row takes ``sampler``)."""

    def __init__(self, sampler: Sampler, device_sampler: DeviceSampler | None) -> None:
        self.sampler = sampler
        self.device_sampler = device_sampler

    def rows(
        self,
        logits: torch.Tensor,
        sampling: list,
        steps: list[int] | None = None,
        pending: PendingTokens | None = None,
    ) -> tuple[torch.Tensor, list[RowLogprobs]]:
        """Sample each row on the CUDA fast path (``device_sampling``) when its own
        parameters are plain, else with the full sampler (processors, seeded generators):
        the token ids [N] on the device and the logprobs of the rows that ask for them, not
        yet read (nothing here waits for the device). ``steps``: each row's output position
        (``_on_device_rows``); ``pending``: the rows' tokens still in flight, which the
        processors count (an overlapped step).

        The path is chosen per row, from that row's parameters alone, so what a seeded
        request samples never depends on what else shares the batch. Logprobs play no
        part in the choice (both paths read them from the raw logits), so asking for
        them never changes the tokens."""
        generators = [seq.generator for seq in sampling]
        fast = [i for i, seq in enumerate(sampling) if self._on_device(seq.sampling_params)]
        if not fast:
            out = self.sampler.forward(logits, sampling, generators, pending)
            return out.token_ids, [out.found] if out.found is not None else []
        n = len(sampling)
        fast_rows = index_on(fast, logits.device) if len(fast) < n else None
        fast_logits = logits if fast_rows is None else logits[fast_rows]  # [F, V]
        fast_steps = [steps[i] for i in fast] if steps is not None else None
        fast_ids, found = self._fast(fast_logits, [sampling[i] for i in fast], fast_steps)
        parts = [found.moved_to(fast)] if found is not None else []
        if len(fast) == n:
            return fast_ids, parts
        fast_set = set(fast)
        slow = [i for i in range(n) if i not in fast_set]
        slow_rows = index_on(slow, logits.device)
        out = self.sampler.forward(
            logits[slow_rows],
            [sampling[i] for i in slow],
            [generators[i] for i in slow],
            pending.select(slow) if pending is not None else None,
        )
        token_ids = torch.empty(n, dtype=torch.int64, device=logits.device)
        token_ids[fast_rows] = fast_ids
        token_ids[slow_rows] = out.token_ids
        if out.found is not None:
            parts.append(out.found.moved_to(slow))
        return token_ids, parts

    def _fast(
        self, logits: torch.Tensor, sampling: list, steps: list[int] | None = None
    ) -> tuple[torch.Tensor, RowLogprobs | None]:
        """Rows that all sample on the CUDA fast path (``_on_device_rows``): their token
        ids [N] on the device, and the logprobs of those that ask for them, computed on the
        device from the raw logits (a copy taken before the kernel), not yet read."""
        params = [seq.sampling_params for seq in sampling]
        # the kernel edits the logits in place unless every row is greedy (an argmax)
        taken = RawLogprobs.take(logits, params, copy=not all(p.greedy for p in params))
        ids = self._on_device_rows(logits, sampling, steps)
        return ids, taken.read(ids) if taken is not None else None

    def _on_device(self, params) -> bool:
        """Whether a row with ``params`` samples in the CUDA kernel (logprobs do not count:
        they never change what is sampled)."""
        return self.device_sampler is not None and not params.edits_logits

    def _on_device_rows(
        self, logits: torch.Tensor, sampling: list, steps: list[int] | None = None
    ) -> torch.Tensor:
        """The CUDA fast path for rows that are all plain: token ids [N] on the device.
        ``steps``: the output position each row samples (default: after its output so
        far; an overlapped step's rows are one further, see ``ModelRunner.launch_decode``)."""
        return self.device_sampler.sample(
            logits,
            [seq.sampling_params for seq in sampling],
            [seq.generator for seq in sampling],
            steps if steps is not None else [seq.num_output_tokens for seq in sampling],
        )
