"""Gateway: the gRPC and HTTP front over one transport-free JobService."""
