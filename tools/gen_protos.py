"""Regenerate farm/proto/v1 from protos/: `python tools/gen_protos.py` (needs the dev extra's grpcio-tools).

The .proto files live at protos/farm/proto/v1/, so with `-I protos` protoc names the generated modules
`farm.proto.v1.*` and their imports are package-absolute without any rewriting.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"


def generate(out: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "farm/proto/v1").glob("*.proto"))
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write farm/proto/v1/ under")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    sys.exit(main())
