"""Shared argparse types of ``commands/_plan_common.py`` used by commands and benchmarks."""

from __future__ import annotations

import argparse
import os

import pytest

from recserve.commands._plan_common import core_list


def test_core_list_takes_numbers_and_ranges_of_usable_cores():
    usable = sorted(os.sched_getaffinity(0))
    first, last = usable[0], usable[-1]
    assert core_list(str(first)) == [first]
    assert core_list(f"{first}-{first}") == [first]
    assert core_list(",".join(map(str, usable))) == usable
    for bad, why in (("x", "expected core numbers"), ("", "not all usable"), (f"{last + 1}", "not all usable"),
                     (f"{first}-{last + 1}", "not all usable")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            core_list(bad)
