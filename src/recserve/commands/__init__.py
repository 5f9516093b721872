"""One module per top-level ``recserve`` command; each exposes ``register(subparsers)``."""
