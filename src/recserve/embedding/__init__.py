"""embedding package."""
