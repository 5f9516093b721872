#!/usr/bin/env bash
# Regenerates the Open Inference Protocol (KServe v2 / Triton) gRPC stubs in src/recserve/serving/wire/proto/ from the
# .proto files beside them (copied unchanged from github.com/triton-inference-server/common, protobuf/, commit
# b0b538731dfbd910af5b90027f811677526072d8).
#
# protoc runs from that folder with bare file names, as Triton's own build does, so the descriptors register as
# "grpc_service.proto" / "model_config.proto" in package "inference": byte-identical to tritonclient's, which lets
# both live in one process (tests/test_grpc_stubs.py checks it). Only the generated cross-imports are rewritten to
# package imports, and grpc_service_pb2* is renamed service_pb2* (tritonclient's names).
#
# grpcio-tools is pinned: 1.76.0 bundles protoc 31.1, whose code needs protobuf >= 6.31.1 and grpcio >= 1.76.0 at
# run time (pyproject.toml's floors). Usage: scripts/gen_proto.sh [python with grpcio-tools==1.76.0]; without an
# argument it makes a throw-away venv.
set -euo pipefail

TOOLS="grpcio-tools==1.76.0"
cd "$(dirname "$0")/.."
OUT=src/recserve/serving/wire/proto
PY="${1:-}"
if [[ -z "$PY" ]]; then
  venv="$(mktemp -d)"
  trap 'rm -rf "$venv"' EXIT
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$TOOLS"
  PY="$venv/bin/python"
fi
"$PY" -c "import importlib.metadata as m; v = m.version('grpcio-tools'); assert v == '${TOOLS#*==}', v"

"$PY" -m grpc_tools.protoc -I"$OUT" --python_out="$OUT" --grpc_python_out="$OUT" \
  "$OUT/grpc_service.proto" "$OUT/model_config.proto"
rm -f "$OUT/model_config_pb2_grpc.py"  # model_config.proto declares no service
mv "$OUT/grpc_service_pb2.py" "$OUT/service_pb2.py"
mv "$OUT/grpc_service_pb2_grpc.py" "$OUT/service_pb2_grpc.py"
sed -i 's/^import model_config_pb2 as /from recserve.serving.wire.proto import model_config_pb2 as /' "$OUT/service_pb2.py"
sed -i 's/^import grpc_service_pb2 as /from recserve.serving.wire.proto import service_pb2 as /' "$OUT/service_pb2_grpc.py"
grep -q "^from recserve.serving.wire.proto import model_config_pb2" "$OUT/service_pb2.py"
grep -q "^from recserve.serving.wire.proto import service_pb2" "$OUT/service_pb2_grpc.py"
echo "generated: $(ls "$OUT"/*_pb2*.py | tr '\n' ' ')"
