"""perfmodel package."""
