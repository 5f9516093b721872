#!/usr/bin/env bash
# Fetch here (where PyPI is reachable) the Python 3.12 wheels that a lent GPU machine lacks, into .whl/ (ignored by
# git, carried with `carry: [".whl"]`), at this venv's versions where it has them; round.sh installs them there.
#
# The device's image has torch, numpy, scipy, aiohttp, pyyaml, uvloop, grpcio and protobuf, but not recserve's
# serving dependencies (hpack, httptools, orjson, pysimdjson, tritonclient and its clients' needs), the FastAPI peer, or perf_analyzer.
# grpcio and protobuf travel too: tritonclient's generated stubs need the protobuf they were made with.
#
#     bash benchmarks/device/wheels.sh            # then: du -sh .whl (must stay well under the 64 MiB a call carries)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DEST=.whl
PACKAGES=(hpack httptools orjson pysimdjson tritonclient python-rapidjson geventhttpclient gevent greenlet zope.event zope.interface
          brotli certifi grpcio protobuf fastapi starlette pydantic pydantic-core annotated-types typing-inspection
          annotated-doc opentelemetry-api anyio uvicorn h11 perf-analyzer)

# versions taken where this venv has none (FastAPI from 0.12x imports opentelemetry: its API wheel travels too)
declare -A FALLBACK=([fastapi]=0.115.12 [starlette]=0.46.2)

version_here() {  # this venv's version of $1, else its fallback, or nothing
  local v
  v=$({ "$PY" -m pip show "$1" 2>/dev/null || true; } | sed -n 's/^Version: //p')
  echo "${v:-${FALLBACK[$1]:-}}"
}

# pip matches a manylinux tag's glibc version exactly: name every one up to the device's glibc 2.39
PLATFORMS=(--platform any --platform manylinux1_x86_64 --platform manylinux2014_x86_64)
for n in 5 17 24 27 28 31 34 35 38 39; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done

mkdir -p "$DEST"
for name in "${PACKAGES[@]}"; do
  version=$(version_here "$name")
  spec=$name${version:+==$version}
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d "$DEST" "$spec"; then
    echo "wheels.sh: no cp312 manylinux wheel for $spec" >&2
    exit 1
  fi
done
echo "wheels.sh: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
