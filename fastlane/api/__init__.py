"""The gRPC interface of a node: servicers translate protobuf to domain calls and back."""
