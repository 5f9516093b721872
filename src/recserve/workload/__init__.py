"""Workloads: query sizes, Poisson arrivals, embedding-index skew and diurnal load traces.

Everything is seeded (a seed or a ``numpy.random.Generator``) and can be saved to and loaded from files.
"""

from recserve.workload._common import WorkloadError, as_rng, parse_spec
from recserve.workload.arrivals import (
    QueryTrace,
    piecewise_poisson_arrivals,
    poisson_arrivals,
    poisson_gaps,
    query_trace,
)
from recserve.workload.diurnal import DiurnalTrace, diurnal_shape, diurnal_trace
from recserve.workload.indices import (
    INDEX_SAMPLERS,
    LocalitySampler,
    ZipfSampler,
    index_sampler,
    measure_locality,
    zipf_alpha_for_locality,
    zipf_locality,
    zipf_rank_cdf,
)
from recserve.workload.sizes import (
    SIZE_DISTRIBUTIONS,
    SizeDistribution,
    load_sizes,
    production_query_sizes,
    production_size_pmf,
    save_sizes,
    size_distribution,
    summarize,
)

__all__ = [
    "INDEX_SAMPLERS",
    "SIZE_DISTRIBUTIONS",
    "DiurnalTrace",
    "LocalitySampler",
    "QueryTrace",
    "SizeDistribution",
    "WorkloadError",
    "ZipfSampler",
    "as_rng",
    "diurnal_shape",
    "diurnal_trace",
    "index_sampler",
    "load_sizes",
    "measure_locality",
    "parse_spec",
    "piecewise_poisson_arrivals",
    "poisson_arrivals",
    "poisson_gaps",
    "production_query_sizes",
    "production_size_pmf",
    "query_trace",
    "save_sizes",
    "size_distribution",
    "summarize",
    "zipf_alpha_for_locality",
    "zipf_rank_cdf",
    "zipf_locality",
]
