"""Hercules planners: node task-scheduling search (search.py) and cluster provisioning (provision.py)."""
