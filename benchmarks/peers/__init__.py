"""Peer servers for the serving benchmark: the same PyTorch model behind FastAPI and Ray Serve."""
