"""``recserve report`` on a result of a known kind with missing or mistyped fields: one line, exit 2."""

from __future__ import annotations

import json

import pytest

from recserve.cli import main


@pytest.mark.parametrize(("data", "words"), [
    ({"kind": "demo-live"}, "a demo-live result needs field 'models'"),
    ({"kind": "demo"}, "a demo result needs field 'steps'"),
    ({"kind": ["x"]}, "field 'kind' must be a string, not a list"),
    ({"kind": "demo", "steps": "x"}, "field 'steps' of a demo result must be a list, not a string"),
    ({"kind": "load_run", "latency_ms": 3, "errors": {}}, "field 'latency_ms' of a load_run result must be a mapping"),
    ({"kind": "max_load"}, "a max_load result needs field 'probes'"),
    ({"kind": "demo", "steps": [{"name": "x"}]}, "a record of this demo lacks field 'ok'"),
    ({"kind": "max_load", "probes": ["x"]}, "a field of this max_load has the wrong type or value"),
])
def test_a_malformed_result_of_a_known_kind_is_one_line_naming_file_and_field(tmp_path, capsys, data, words):
    result, out = tmp_path / "bad.json", tmp_path / "r.html"
    result.write_text(json.dumps(data))
    assert main(["report", str(result), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{result}: {words}" in err and "Traceback" not in err
    assert not out.exists()
