"""The service around the engine: environment settings, the gRPC servicer, proto messages."""
