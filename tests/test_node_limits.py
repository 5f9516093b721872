"""A node's resource bounds against many or idle clients: open files, connections per worker, idle timeouts."""

from __future__ import annotations

import subprocess
import sys


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit_at_start():
    code = """
import resource
from recserve.serving.server import raise_open_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
now = raise_open_file_limit()
print(now, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    now, soft, hard = (int(x) for x in out.stdout.split())
    assert now == soft and (soft == hard or (hard == -1 and soft > 256))
