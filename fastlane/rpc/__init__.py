"""What client and server share about the wire: protobuf <-> domain (:mod:`.wire`) and errors <-> gRPC status codes (:mod:`.status`)."""
