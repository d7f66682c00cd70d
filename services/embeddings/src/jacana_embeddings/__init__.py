"""Jacana's embeddings service: sentence-transformers encoder models behind gRPC.

Layout: ``model_spec`` reads a model directory (HF config + sentence-transformers modules),
``encoders`` / ``bert`` are the transformer itself (run on packed batches, ``varlen``, with
dense layers from ``linear_backends``), ``pooling`` and ``heads`` what follows it,
``embedder`` puts them together, ``tokenize_queue`` tokenizes off the event loop,
``batcher`` groups concurrent requests into forward passes, ``service`` validates
requests, ``server`` is the gRPC front.
"""
