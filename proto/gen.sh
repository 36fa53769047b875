#!/bin/sh
# Regenerate broker/v1/*_pb2*.py from proto/. Run from anywhere; never edit the output by hand.
# tests/test_proto.py fails when the committed code is stale.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
cd "$root"
python -m grpc_tools.protoc -I proto --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" proto/broker/v1/broker.proto
