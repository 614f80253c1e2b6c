"""The head: the gRPC control plane, the state store and the Ray driver that runs shards on the nodes."""
