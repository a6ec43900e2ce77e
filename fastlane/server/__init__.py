"""A fastlane node: the composition root (:mod:`.node`), its gRPC listener (:mod:`.grpc_server`),
the servicers that turn protobuf requests into engine operations (:mod:`.servicers`), and the
guard that maps every unexpected failure to a clean gRPC status (:mod:`.guard`)."""
