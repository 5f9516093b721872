"""recserve's benchmarks: each ``bench_*`` module runs as ``python -m benchmarks.bench_x`` from the repository root
(with ``PYTHONPATH=src`` or recserve installed) and writes its result through :mod:`benchmarks.harness`."""
