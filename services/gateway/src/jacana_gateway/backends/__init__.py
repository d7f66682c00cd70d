"""The gRPC services behind the gateway: per model, the replicas that serve it, which one
gets the next request, and the calls made to them.

- :mod:`.replica_pool`: replicas, channels, least-in-flight routing, health probes,
  failover for idempotent calls; the :class:`ServiceBackends` base of one kind of service;
- :mod:`.engine`: the engines' streaming ``Generate`` call;
- :mod:`.embeddings`: ``Embed`` on embeddings services (and on pooling engines);
- :mod:`.asr`: ``Transcribe`` on speech-to-text services;
- :mod:`.videos`: the video job calls on multimodal services, and their model cards.
"""
