#!/bin/bash
# Run here (no device time), before a session's H200 calls: the cp312 wheels Farm needs that the lent H200's image
# lacks (docs/h200-run.md lists what it has: torch, numpy, grpcio 1.84, protobuf, aiohttp, psutil, pyyaml,
# scikit-learn, transformers, nvidia-ml-py), in one tar split into three parts under 64 MiB, one a call:
# .whl/gpu/c1, c2 and c3, as benchmarks/gpu/stage.sh puts them together on the device (c1 and c2 copied to
# /tmp/parts by two calls back to back, c3 carried by the benchmark's own call).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=.whl/gpu/all
rm -rf .whl/gpu && mkdir -p $W .whl/gpu/c1 .whl/gpu/c2 .whl/gpu/c3
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_34_x86_64 --platform any --no-deps -d $W \
  ray==2.60.0 jsonschema referencing rpds-py jsonschema-specifications attrs msgpack filelock \
  "pyarrow>=15" "pydantic>=2.7,<3" pydantic-core typing-inspection annotated-types typing-extensions \
  "pydantic-settings>=2.6" python-dotenv tomli-w typer rich markdown-it-py mdurl pygments click shellingham \
  prometheus-client uvloop "fsspec>=2024.2" pillow "cryptography>=42" cffi pycparser cloudpickle
# pydantic pins its core exactly: take the core the downloaded pydantic names, not the newest
core=$(unzip -p $W/pydantic-2*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
rm -f $W/pydantic_core-*.whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --no-deps -d $W "pydantic-core==$core"
tar cf .whl/gpu/wheels.tar -C $W .
split -b 52m -a 2 .whl/gpu/wheels.tar .whl/gpu/wheels.part.
mv .whl/gpu/wheels.part.aa .whl/gpu/c1/ && mv .whl/gpu/wheels.part.ab .whl/gpu/c2/
mv .whl/gpu/wheels.part.ac .whl/gpu/c3/ 2>/dev/null || : > .whl/gpu/c3/wheels.part.ac  # a tar under 104 MiB
[ ! -e .whl/gpu/wheels.part.ad ] || { echo "the wheels need a fourth part: widen stage.sh" >&2; exit 1; }
rm -rf $W .whl/gpu/wheels.tar
ls -l .whl/gpu/c1 .whl/gpu/c2 .whl/gpu/c3
