"""What crosses a process boundary: the infer codec, the error table, model metadata, shared-memory regions and the
generated gRPC messages.  Imports only ``serving.transport`` below it."""
