"""One gRPC servicer per service in ``proto/``: validate the request, read the store or take an engine operation, answer."""
