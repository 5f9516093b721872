#!/usr/bin/env bash
# Issue #14's and #16's must-shows on a lent GPU machine (16 cores, Python 3.12, torch preinstalled), phase by phase,
# each bounded so that one device call (10 minutes at most) holds it.  Run from the repository root there, with the
# wheels of benchmarks/device/wheels.sh carried:
#
#     run(command="bash benchmarks/device/round.sh env scaling", carry=[".whl"], timeout_s=600)
#
# Phases (minutes, roughly, on the H100 host; a task now has 15 device-minutes, start-up included: one long phase
# (scaling, mixed or route) or two or three short ones a session; #14 asks scaling first, #16 gpu, mixed, route):
#   env      (0.5) versions, GPU, cores, and an import of everything the phases need
#   scaling  (9)   #14: max load at p95 <= 100 ms, recserve vs FastAPI + uvicorn, 1 / 8 / 16 workers, one run
#   overhead (4)   #14: per-query overhead and server CPU at batch 1 and 256 (HTTP, gRPC, bare clients)
#   pa       (3)   #14: perf_analyzer over HTTP, gRPC and gRPC streaming, Poisson arrivals
#   gpu      (7)   #16: in-process CPU vs GPU, served GPU latency and scores' max abs difference over HTTP and gRPC
#   mixed    (9)   #16: max load of a GPU-only, a mixed CPU+GPU and a CPU-only node on the production mix
#   route    (8)   #16: the Kairos router over a GPU node and a CPU node against FCFS, with the simulator beside
#   protocols (8)  #51: one gRPC channel, plain JSON and the binary extension, max load at 1 / 8 / 16 workers
#   native   (0.2) build the native JSON number reader for this Python (without it a node reads JSON with simdjson)
#   grpc2    (3)   #51: one gRPC channel and HTTP binary, max load at 1 / 2 / 8 workers (one generator process)
#   peers16  (7)   #51: every recserve protocol beside FastAPI, max load at 1 / 8 / 16 workers, 4 generator processes
#                  ($PEERS16: the servers, when FastAPI cannot run there)
#   balance  (4)   #51: HTTP binary at 8 / 16 workers, fixed rates: each worker's share of the queries, p95 and 503s,
#                  for main and each variant in benchmarks/device/variants/ (a patch of src, applied to a copy; now
#                  the tree before the connections' spread over workers)
#   threads  (3)   #50: threads sharing RMC1's tables, slowdown beside 1 / 3 / 7 / 15 co-runners, and one call's
#                  op-parallel speed-up on 1-16 cores, each against the perfmodel (Hercules' CPU search rows)
# With 15 device-minutes (start-up included) the open issues' device must-shows take two calls, most needed first:
#   1. env native peers16   (~8 min)  #51: every recserve protocol and FastAPI at 1 / 8 / 16 workers
#   2. grpc2 threads        (~6 min)  #51: one gRPC channel at 2 workers vs 1; #50: Hercules' CPU search rows
# and balance (#51, the connections' spread) in a later session.
# Every phase writes its JSON and its log to $OUT (the device tool brings them back); with no $OUT, to results/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results}
mkdir -p "$OUT"
WHEELS=${WHEELS:-.whl}  # none: use what is installed (a check of this script where the wheels do not fit)
PY=${PY:-python3}
if [ "$WHEELS" != none ] && [ -d "$WHEELS" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "round.sh: installing the wheels in $WHEELS failed" >&2; exit 1; }
  export PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
CORES=$(nproc)
LIMIT_S=${LIMIT_S:-}  # a bound for every phase instead of its own (LIMIT_S=8: do the phases' arguments parse?)

phase() {  # name, seconds, command...: run it bounded, its output kept in $OUT/<name>.log
  local name=$1 limit=${LIMIT_S:-$2}
  shift 2
  echo "== $name (at most ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}

for name in "$@"; do
  case $name in
    env)
      phase env 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; \
        $PY -c 'import sys, torch, numpy, recserve.serving, tritonclient.grpc, fastapi, uvicorn, orjson, hpack; \
print(sys.version.split()[0], torch.__version__, torch.cuda.is_available(), numpy.__version__)'; \
        command -v perf_analyzer || echo 'no perf_analyzer on PATH'" ;;
    scaling)
      phase scaling 560 $PY -m benchmarks.bench_peers --model hercules-rmc1 --scale 0.001 --sla-ms 100 \
        --workers "1,8,$CORES" --procs 4 --probe-s 2.5 --max-probes 7 --confirm 1 --peers recserve,fastapi \
        --out "$OUT/peers.json" ;;
    overhead)
      phase overhead 300 $PY -m benchmarks.bench_serving_overhead --requests 400 --seconds 2 --split-cores \
        --out "$OUT/serving_overhead.json" ;;
    pa)
      phase pa 240 $PY -m benchmarks.bench_perf_analyzer --model hera-dlrm-a --workers 8 --rates 500,2000 \
        --out "$OUT/perf_analyzer.json" ;;
    gpu)
      phase gpu 480 $PY -m benchmarks.bench_gpu --models hera-din,hera-wnd,hercules-rmc2 --scale 0.01 \
        --out "$OUT/bench_gpu.json" ;;
    mixed)
      phase mixed 560 $PY -m benchmarks.bench_accel --model hera-dlrm-a --scale 0.01 --device cuda \
        --cpu-workers 10 --front-workers 10 --accel-workers 2 --cpu-only-workers 12 --loadgen-cores 4 --procs 4 \
        --min-items 160 --layouts accel,mixed,cpu --warm-s 3 --start-qps 1000 --probe-s 2.5 --max-probes 6 \
        --out "$OUT/accel_mixed.json" ;;
    route)
      phase route 560 $PY -m benchmarks.bench_route --pool gpu --device cuda --gpu-cores 0-3 \
        --out "$OUT/route_gpu.json" --plot "$OUT/route_gpu.png" ;;
    protocols)
      phase protocols 560 $PY -m benchmarks.bench_grpc_scale --model hercules-rmc1 --scale 0.001 --sla-ms 100 \
        --workers "1,8,$CORES" --variants mine=src --protocols grpc,json,http --probe-s 2.5 --max-probes 7 \
        --out "$OUT/protocols.json" ;;
    native)
      phase native 60 bash -c "$PY setup.py -q build_ext --inplace 2>&1 | tail -3; \
        $PY -c 'from recserve.serving.wire import json_numbers as j; print(\"JSON readers\", j.probe())'" ;;
    grpc2)
      phase grpc2 200 $PY -m benchmarks.bench_grpc_scale --model hercules-rmc1 --scale 0.001 --sla-ms 100 \
        --workers 1,2,8 --protocols grpc,http --probe-s 2.5 --start-qps 150 --max-probes 7 \
        --out "$OUT/grpc_one_channel.json" ;;
    peers16)
      phase peers16 420 $PY -m benchmarks.bench_peers --model hercules-rmc1 --scale 0.001 --sla-ms 100 \
        --workers "1,8,$CORES" --procs 4 --probe-s 2 --start-qps 300 --max-probes 6 --confirm 1 \
        --peers "${PEERS16:-recserve,recserve-grpc,recserve-json,fastapi}" --out "$OUT/peers_protocols.json" ;;
    balance)
      variants=base=src
      for patch in benchmarks/device/variants/*.patch; do
        v=$(basename "$patch" .patch)
        rm -rf "/tmp/variants/$v" && mkdir -p "/tmp/variants/$v" && cp -r src "/tmp/variants/$v/"
        (cd "/tmp/variants/$v" && { patch -s -p1 < "$OLDPWD/$patch" || git apply "$OLDPWD/$patch"; }) \
          && variants="$variants,$v=/tmp/variants/$v/src"
      done
      phase balance 300 $PY -m benchmarks.bench_grpc_scale --model hercules-rmc1 --scale 0.001 --sla-ms 100 \
        --workers "${BALANCE_WORKERS:-8,$CORES}" --protocols http --variants "$variants" \
        --rates "${BALANCE_RATES:-600,1100,1500}" --probe-s 3 --out "$OUT/balance.json" ;;
    threads)
      phase threads 300 $PY -m benchmarks.bench_thread_interference --corunners "1,3,7,$((CORES - 1))" \
        --op-threads "1,2,4,8,$CORES" --repeats 2 --seconds 1 --out "$OUT/thread_interference.json" ;;
    *)
      echo "round.sh: unknown phase '$name' (env scaling overhead pa gpu mixed route protocols native grpc2 peers16" \
        "balance threads)" >&2
      exit 2 ;;
  esac
done
