"""The main job (``recserve demo``): the whole pipeline on this host in a few minutes.

specs → profiles (measured here, quick) → calibrated perfmodel → plans (Hera co-location, Kairos
pool, Hercules provisioning, ElasticRec shards, SDM tiers, dispatch simulation) → a live
deployment (a node server co-locating two models, a second node server, the Kairos router in
front) under a diurnal-shaped Poisson load with the production query mix while the Hera resource
manager resizes workers → metrics → an HTML report and a terminal summary.

Every step is the same code the CLI runs; each step's outputs (JSON, PNG) land in ``--out``.
A failed step is reported and the demo carries on with what does not depend on it; the exit code
is non-zero if any step failed.  Everything started is stopped.

A module per job: ``job`` (the steps, the report, the summary), ``load`` (node A, the live rates, the sessions
that send them), ``capacity`` (node A's max loads before the live runs), ``live`` (the controlled live runs),
``pages`` (their figures and report sections, registered with :mod:`recserve.report`).
"""

from recserve.demo.capacity import (
    CONFIRM_PROBES,
    LiveCapacity,
    live_capacity,
    measured_capacity,
    neighbour_load,
    profiled_capacity,
)
from recserve.demo.job import (
    HERA_MODELS,
    HERCULES_DAY,
    DemoRun,
    Step,
    live_step,
    plan_steps,
    print_summary,
    profile_step,
    run_demo,
    write_report,
)
from recserve.demo.live import LIVE_CONTROLLERS, WORKER_SLOTS_PER_CORE, LiveWindow, live_stem, run_live, strict_json
from recserve.demo.load import (
    LIVE_MODELS,
    LIVE_PEAKS,
    PEAK_SHARE,
    background_load,
    diurnal_rates,
    live_rates,
    production_session,
)
from recserve.demo.pages import plot_live, render_demo, render_live

__all__ = ["CONFIRM_PROBES", "HERA_MODELS", "HERCULES_DAY", "LIVE_CONTROLLERS", "LIVE_MODELS", "LIVE_PEAKS",
           "PEAK_SHARE", "WORKER_SLOTS_PER_CORE", "DemoRun", "LiveCapacity", "LiveWindow", "Step", "background_load",
           "diurnal_rates", "live_capacity", "live_rates", "live_step", "live_stem", "measured_capacity",
           "neighbour_load", "plan_steps", "plot_live", "print_summary", "production_session", "profile_step",
           "profiled_capacity", "render_demo", "render_live", "run_demo", "run_live", "strict_json", "write_report"]
