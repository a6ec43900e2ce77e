"""One gRPC servicer per service in ``proto/``: validate the request, call the engine or store, answer."""
