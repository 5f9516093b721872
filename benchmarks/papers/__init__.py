"""Rows of the papers' claims table (``bench_papers.py``) that live in modules of their own."""
