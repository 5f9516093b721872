"""recserve: serve recommendation models at the lowest cost that holds their tail-latency SLAs."""

__version__ = "0.1.0"
