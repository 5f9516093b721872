"""bench_wrk: wrk's Lua script and command, h2load's command, both tools' outputs read back (captured samples),
the rows skipped where a tool is missing; with the tools installed, both run against a small local server."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks import bench_wrk
from benchmarks.common import timing
from benchmarks.peers import loadtools

# wrk 4.1.0 -t1 -c4 -d2s --latency with the generated script (a recserve batch-256 run: 2279 answers were 503)
WRK_SAMPLE = """\
Running 2s test @ http://127.0.0.1:41235/v2/models/hercules-rmc1/infer
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.10ms    7.92ms  61.06ms   92.31%
    Req/s     1.23k   310.11     1.52k    70.00%
  Latency Distribution
     50%    2.02ms
     75%    2.91ms
     90%    7.40ms
     99%   43.66ms
  2464 requests in 2.10s, 1.95MB read
  Non-2xx or 3xx responses: 2279
Requests/sec:   1173.56
Transfer/sec:      0.93MB
WRK_JSON {"requests":2464,"duration_us":2099600,"bytes":2044723,"connect":0,"read":0,"write":0,"status":2279,\
"timeout":1,"p50_us":2020,"p90_us":7400,"p99_us":43660,"max_us":61060}
"""

# h2load (nghttp2 1.52) -D2 --warm-up-time=1 -c4 -m1 -t1 against recserve's gRPC port, batch 256
H2LOAD_SAMPLE = """\
starting benchmark...
spawning thread #0: 4 total client(s). Timing-based test with 1s of warm-up time and 2s of main duration for \
measurements.
Warm-up started for thread #0.
progress: 25% of clients started
progress: 50% of clients started
progress: 75% of clients started
progress: 100% of clients started
Application protocol: h2c
Warm-up phase is over for thread #0.
Main benchmark duration is started for thread #0.
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 3.00s, 294.50 req/s, 150.70KB/s
requests: 589 total, 589 started, 589 done, 588 succeeded, 1 failed, 0 errored, 0 timeout
status codes: 587 2xx, 0 3xx, 0 4xx, 1 5xx
traffic: 301.40KB (308638) total, 270.20KB (276683) headers (space savings -0.34%), 88.90KB (91035) data
                     min         max         mean         sd        +/- sd
time for request:     1.41ms     99.97ms     13.22ms     12.51ms    88.46%
time for connect:        0us         0us         0us         0us     0.00%
time to 1st byte:        0us         0us         0us         0us     0.00%
req/s           :      66.88       78.86       73.49        5.61    75.00%
"""


def test_lua_string_escapes_what_would_end_or_bend_the_literal() -> None:
    assert loadtools.lua_string('a"b\\c\nd') == '"a\\034b\\092c\\010d"'
    assert loadtools.lua_string("/tmp/x y/body.bin") == '"/tmp/x y/body.bin"'


def test_wrk_script_posts_the_file_with_the_headers_and_reports_json(tmp_path: Path) -> None:
    script = loadtools.wrk_script(tmp_path / "body.bin", {"Inference-Header-Content-Length": "123",
                                                          "Content-Type": "application/octet-stream"})
    assert f'io.open("{tmp_path / "body.bin"}", "rb")' in script
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Inference-Header-Content-Length"] = "123"' in script
    assert "done = function(summary, latency, requests)" in script and loadtools.WRK_MARK in script


def test_parse_wrk_counts_only_2xx_as_throughput() -> None:
    r = loadtools.parse_wrk(WRK_SAMPLE)
    assert (r["requests"], r["ok"], r["non_2xx"], r["errors"]) == (2464, 185, 2279, 1)
    assert r["seconds"] == pytest.approx(2.0996)
    assert r["rps"] == pytest.approx(185 / 2.0996)
    assert (r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"]) == (2.02, 7.4, 43.66, 61.06)


def test_parse_wrk_without_the_done_line_says_so() -> None:
    with pytest.raises(ValueError, match="WRK_JSON"):
        loadtools.parse_wrk(WRK_SAMPLE.split("WRK_JSON")[0])


def test_parse_h2load_reads_counts_and_takes_percentiles_from_the_log() -> None:
    log = "".join(f"1764360000{i:06d}\t200\t{1000 * (i + 1)}\n" for i in range(100)) + "1764360000999999\t-1\t5\n"
    r = loadtools.parse_h2load(H2LOAD_SAMPLE, log, answer_bytes=155)
    assert (r["requests"], r["ok"], r["non_2xx"], r["errors"]) == (589, 587, 1, 1)  # 91035 B: 587 answers of 155
    assert r["rps"] == pytest.approx(587 / 3.0)
    assert r["data_bytes"] == 91035 and r["grpc_errors"] == 0
    assert r["p50_ms"] == pytest.approx(50.5) and r["p99_ms"] == pytest.approx(99.01)
    assert r["max_ms"] == 100.0  # the failed stream (-1) is not a latency
    # a gRPC error is an HTTP 200 without a message: with answers of 1000 bytes, 91 of the 587 2xx were answers
    errors = loadtools.parse_h2load(H2LOAD_SAMPLE, log, answer_bytes=1000)
    assert (errors["ok"], errors["grpc_errors"], errors["non_2xx"]) == (91, 496, 497)
    assert errors["rps"] == pytest.approx(91 / 3.0)


def test_parse_h2load_rejects_an_output_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="finished in"):
        loadtools.parse_h2load("h2load: connection refused\n", "")
    refused = H2LOAD_SAMPLE.replace("589 total", "0 total")  # h2load exits 0 when it cannot connect
    with pytest.raises(ValueError, match="no request"):
        loadtools.parse_h2load(refused, "")


def test_grpc_frame_and_h2load_command(tmp_path: Path) -> None:
    assert loadtools.grpc_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    cmd = loadtools.h2load_command("http://127.0.0.1:9000/", tmp_path / "d", tmp_path / "log", 5)
    assert cmd[-1] == "http://127.0.0.1:9000/inference.GRPCInferenceService/ModelInfer"
    assert "content-type: application/grpc" in cmd and "te: trailers" in cmd and "-m1" in cmd and "-D5000ms" in cmd


def test_a_missing_tool_skips_its_rows_with_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadtools.shutil, "which", lambda tool: None if tool == "h2load" else f"/usr/bin/{tool}")
    rows, skipped = bench_wrk.plan_rows(["recserve", "recserve-grpc", "kserve-grpc", "fastapi"],
                                        can_run=lambda name: "not installed here: fastapi" if name == "fastapi"
                                        else None)
    assert rows == ["recserve"]
    assert set(skipped) == {"recserve-grpc", "kserve-grpc", "fastapi"}
    assert "apt-get install wrk nghttp2-client" in skipped["kserve-grpc"]
    assert skipped["fastapi"] == "not installed here: fastapi"


def test_the_peers_http_rows_speak_plain_json_and_recserve_binary() -> None:
    assert bench_wrk.as_json("recserve", "http://h:1") == "http://h:1"
    assert bench_wrk.as_json("recserve-nofuse", "http://h:1") == "http://h:1"
    assert bench_wrk.as_json("recserve-json", "http+json://h:1") == "http+json://h:1"
    assert bench_wrk.as_json("fastapi", "http://h:1") == "http+json://h:1"
    assert bench_wrk.as_json("kserve-grpc", "grpc://h:2") == "grpc://h:2"


def test_binary_rows_send_a_peer_the_binary_extension_and_the_wire_names_what_a_row_carries() -> None:
    assert bench_wrk.as_json("fastapi", "http://h:1", frozenset({"fastapi"})) == "http://h:1"
    assert bench_wrk.as_json("kserve-rest", "http://h:1", frozenset({"fastapi"})) == "http+json://h:1"
    assert [bench_wrk.wire_of(u) for u in ("http://h:1", "http+json://h:1", "grpc://h:2")] == ["binary", "json", "grpc"]


def test_cpu_per_answer_is_compared_with_recserves_row_of_the_same_wire() -> None:
    rows = {"recserve": {"rps": 100.0, "wire": "binary", "server_cpu_us_per_answer": 1000.0},
            "fastapi": {"rps": 50.0, "wire": "binary", "server_cpu_us_per_answer": 1800.0},
            "recserve-grpc": {"rps": 80.0, "wire": "grpc", "server_cpu_us_per_answer": 1200.0},
            "kserve-grpc": {"rps": 40.0, "wire": "grpc", "server_cpu_us_per_answer": 3000.0},
            "kserve-rest": {"rps": 5.0, "wire": "json", "server_cpu_us_per_answer": 9000.0},  # no recserve-json row
            "ray-serve": {"rps": 10.0, "wire": "binary", "server_cpu_us_per_answer": None}}  # not measured
    bench_wrk.add_ratios({"by_workers": {"1": {"240": rows}}})
    assert rows["fastapi"]["cpu_over_recserve"] == pytest.approx(1.8)
    assert rows["kserve-grpc"]["cpu_over_recserve"] == pytest.approx(2.5)
    assert rows["recserve"]["cpu_over_recserve"] == pytest.approx(1.0)
    assert rows["kserve-rest"]["cpu_over_recserve"] is None
    assert rows["ray-serve"]["cpu_over_recserve"] is None
    assert rows["fastapi"]["recserve_over_it"] == pytest.approx(2.0)


def test_a_servers_processes_are_those_listening_on_its_port_and_their_descendants() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert os.getpid() in timing.listening_pids(port)
            tree = timing.process_tree(timing.listening_pids(port))
            assert {os.getpid(), child.pid} <= tree
            assert timing.tree_cpu_s(tree) > 0
        finally:
            child.kill()
            child.wait()
    assert os.getpid() not in timing.listening_pids(port)
    assert timing.tree_cpu_s({child.pid}) == 0  # a process gone counts nothing


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers a POST with what it received: its length and two headers."""

    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append({"length": len(body), "type": self.headers["Content-Type"],
                          "head": self.headers["Inference-Header-Content-Length"], "first": body[:4]})
        answer = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("wrk") is None, reason=f"wrk not installed ({loadtools.INSTALL_HINT})")
def test_wrk_posts_the_fixed_body_and_its_summary_parses(tmp_path: Path) -> None:
    body = bytes(range(256)) * 40  # binary, with NULs and quotes
    (tmp_path / "body.bin").write_bytes(body)
    script = tmp_path / "post.lua"
    script.write_text(loadtools.wrk_script(tmp_path / "body.bin", {"Content-Type": "application/octet-stream",
                                                                   "Inference-Header-Content-Length": "7"}))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v2/models/m/infer"
        done = subprocess.run(loadtools.wrk_command(url, script, 1, connections=2), capture_output=True, text=True,
                              timeout=60, check=True)
    finally:
        server.shutdown()
        server.server_close()
    r = loadtools.parse_wrk(done.stdout)
    assert r["ok"] > 0 and r["non_2xx"] == 0 and r["p50_ms"] > 0
    assert _Echo.seen[0] == {"length": len(body), "type": "application/octet-stream", "head": "7",
                             "first": body[:4]}


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("h2load") is None, reason=f"h2load not installed ({loadtools.INSTALL_HINT})")
def test_h2load_sends_a_grpc_call_the_server_answers(tmp_path: Path) -> None:
    from concurrent import futures

    import grpc

    got: list[bytes] = []

    def infer(request: bytes, context) -> bytes:
        got.append(request)
        return b"answer!"

    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(infer)})  # no (de)serializers: bytes in, bytes out
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        (tmp_path / "data").write_bytes(loadtools.grpc_frame(b"question"))
        cmd = loadtools.h2load_command(f"http://127.0.0.1:{port}", tmp_path / "data", tmp_path / "log", 1,
                                       connections=2, warmup_s=0.5)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    finally:
        server.stop(None)
    r = loadtools.parse_h2load(done.stdout, (tmp_path / "log").read_text(), answer_bytes=5 + len(b"answer!"))
    assert r["ok"] > 0 and r["errors"] == 0 and r["grpc_errors"] == 0
    assert set(got) == {b"question"}


@pytest.mark.integration
@pytest.mark.parametrize("row", ["recserve-json", "recserve-grpc"])
def test_recserve_answers_the_fixed_request_in_each_protocol_with_the_models_scores(row: str) -> None:
    """The bytes the tool would send (plain JSON; one framed ModelInferRequest), sent once, get the model's scores
    (to within an ulp: a fresh node's first query was seen 6e-8 off the in-process model, in every protocol)."""
    import argparse

    from benchmarks import bench_peers
    from benchmarks.peers import servers
    from recserve.measure.requests import RequestPool
    from recserve.specs import get_model

    pool = RequestPool(get_model("hercules-rmc1"), 1e-3, (3,))
    want = [bench_peers.reference_scores("hercules-rmc1", 1e-3, pool, 0)]
    with servers.PEERS[row]("hercules-rmc1", 1e-3, 1, 1000.0) as url:
        assert url.startswith("grpc://" if row.endswith("grpc") else "http+json://")
        check, answer_bytes = bench_wrk.check_row(row, url, argparse.Namespace(model="hercules-rmc1"), pool, want, 0)
    assert check["shape"] == [3, 1] and check["max_abs_diff"] <= 1e-6
    assert answer_bytes > 3 * 4  # at least the three scores
