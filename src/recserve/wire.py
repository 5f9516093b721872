"""Open Inference Protocol tensor names of the one input format (see ``zoo/batch.py``).

They live in this dependency-free module so that the numpy-only codec (``serving/wire/codec/``) and
the router can name tensors without importing torch through ``recserve.zoo``.
"""

INPUT_DENSE = "dense"
INPUT_VALUES = "sparse_values"
INPUT_LENGTHS = "sparse_lengths"
OUTPUT_SCORES = "scores"

# Optional request header carrying the query's batch size, for routers that cannot read the body (a Ray Serve
# request router sees only the HTTP scope); recserve's load generator sends it with ``size_header=True``.
BATCH_SIZE_HEADER = "Recserve-Batch-Size"

SMALL_QUERY_LENGTHS = 64
"""Up to this many bag lengths (tables x batch: a batch-1 query's ten or so) a query's checks read them as a Python
list, in the codec and in ``zoo.batch.check_query`` alike: ~1 µs where each of ~8 numpy calls costs ~3 µs."""
