"""Open Inference Protocol tensor names of the one input format (see ``zoo/batch.py``).

They live in this dependency-free module so that the numpy-only codec (``serving/codec.py``) and
the router can name tensors without importing torch through ``recserve.zoo``.
"""

INPUT_DENSE = "dense"
INPUT_VALUES = "sparse_values"
INPUT_LENGTHS = "sparse_lengths"
OUTPUT_SCORES = "scores"
