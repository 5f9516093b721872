"""The device kit's variants (``benchmarks/device/variants/*.patch``) still apply to ``src/``: a round on a lent
machine measures them beside main, and a patch that no longer applies would be skipped there unseen."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted((ROOT / "benchmarks" / "device" / "variants").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None, reason="git applies the patches")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_each_variant_applies_to_src(patch):
    done = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    touched = [line[6:] for line in patch.read_text().splitlines() if line.startswith("+++ b/")]
    assert touched and all(path.startswith("src/") for path in touched)


def test_the_kit_has_variants():
    assert PATCHES
