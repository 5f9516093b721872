"""Calibrated analytic performance model: latency, max load, bandwidth and footprint of a model on a
server type under an allocation, for server types we cannot run (see docs/perfmodel.md).

    from recserve.perfmodel import PerfModel, Allocation, model_profiles
    pm = PerfModel()                       # bundled constants, or PerfModel("calibration.json")
    pm.latency_ms(spec, server, 128, Allocation(workers=4))
    pm.max_load(spec, server, Allocation(workers=16, batch=64), sizes, sla)
    model_profiles([spec], [server]).save("profiles/modelled.json")
"""

from recserve.perfmodel.calibration import Calibration, load_calibration
from recserve.perfmodel.cost import ModelCost, model_cost, scaled_spec
from recserve.perfmodel.model import Allocation, LoadResult, PerfModel
from recserve.perfmodel.queueing import SizeMix, production_sizes
from recserve.perfmodel.tables import model_profiles

__all__ = [
    "Allocation",
    "Calibration",
    "LoadResult",
    "ModelCost",
    "PerfModel",
    "SizeMix",
    "load_calibration",
    "model_cost",
    "model_profiles",
    "production_sizes",
    "scaled_spec",
]
