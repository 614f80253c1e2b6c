from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from farm.core.models import BackendName, BackendOffer, Gpu, Hardware, Node, NodeState
from farm.proto import convert

ROOT = Path(__file__).resolve().parents[2]


def test_committed_generated_code_matches_the_protos(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)], check=True)
    generated = {p.relative_to(tmp_path) for p in (tmp_path / "farm/proto/v1").iterdir()}
    committed = {p.relative_to(ROOT) for p in (ROOT / "farm/proto/v1").iterdir() if p.name != "__init__.py"
                 and p.name != "__pycache__"}
    assert generated == committed, "run `python tools/gen_protos.py`"
    for name in generated:
        assert (tmp_path / name).read_bytes() == (ROOT / name).read_bytes(), f"{name} is stale: run tools/gen_protos.py"


def test_generated_code_asks_for_no_newer_grpc_than_1_84() -> None:
    # The lent GPU machines carry grpcio 1.84: the generated stubs must import there.
    text = (ROOT / "farm/proto/v1/agent_pb2_grpc.py").read_text()
    version = text.split("GRPC_GENERATED_VERSION = '")[1].split("'")[0]
    assert tuple(int(x) for x in version.split(".")[:2]) <= (1, 84)


def test_hardware_and_offers_round_trip() -> None:
    hw = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="c", cpu_cores=16, memory_bytes=2**40,
                  gpus=(Gpu(index=0, name="NVIDIA H200", memory_bytes=150 * 2**30, driver="580"),))
    offer = BackendOffer(name=BackendName.CUDA, device="cuda:0", threads=1, available=False, reason="why")
    assert convert.hardware_from_pb(convert.hardware_to_pb(hw)) == hw
    assert convert.offer_from_pb(convert.offer_to_pb(offer)) == offer
    metered = BackendOffer(name=BackendName.CUDA, device="cuda:0", meter_step_s=0.1, idle_w=0.0, idle_source="counter")
    assert convert.offer_from_pb(convert.offer_to_pb(metered)) == metered  # an idle draw of 0 W stays measured
    assert convert.offer_from_pb(convert.offer_to_pb(offer)).idle_w is None  # and none stays none


def test_json_keeps_64_bit_integers_as_numbers() -> None:
    hw = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="c", cpu_cores=2, memory_bytes=2**40,
                  gpus=(Gpu(index=0, name="g", memory_bytes=2**37),))
    node = Node(id="n", name="a", state=NodeState.READY, hardware=hw, backends=())
    data = convert.to_dict(convert.node_to_pb(node))
    assert data["hardware"]["memory_bytes"] == 2**40
    assert data["hardware"]["gpus"][0]["memory_bytes"] == 2**37
    assert data["state"] == "ready" and data["backends"] == []
