"""A worker process: its main, its data plane (admission queue, connections, compute), gRPC methods, siblings and
accelerator workers.  Imports ``wire`` and ``transport``, never ``node``."""
