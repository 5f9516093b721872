"""Errors a user can cause and fix: the CLI prints them as one line and exits with code 2 (3 when infeasible)."""

from __future__ import annotations

EXIT_INFEASIBLE = 3
"""The CLI's exit code for a valid request that no plan meets: not a typo (2), not a crash (1)."""


class RecserveError(Exception):
    """Bad input (unknown name, malformed file, impossible request). Never a bug in recserve."""


class SpecError(RecserveError):
    """A ModelSpec, ServerType, SLA or Traffic description is missing fields or has bad values."""


class ProfileError(RecserveError):
    """A Profile file is missing, of the wrong version, or lacks the table a planner needs."""


class InfeasibleError(RecserveError):
    """A planner was asked for something no deployment can satisfy (load, budget, SLA): exit code 3."""
