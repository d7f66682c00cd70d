"""Token selection: sampling parameters, the host and device samplers, logits processors
and structured-output masks."""
