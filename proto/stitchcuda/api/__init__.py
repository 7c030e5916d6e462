"""Versioned protobuf contracts (generated *_pb2 modules live beside the .proto files)."""
