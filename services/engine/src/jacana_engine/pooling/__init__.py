"""Embeddings from the served decoder: pooling methods, which pooling a model serves,
embedding requests and their inputs."""
