"""The console's snapshot structs (console.core.snapshot) against the agent's pydantic
models (console.core.wire): one contract, two readers, so they must not drift."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import msgspec
import pytest
from pydantic import BaseModel

from console.core import snapshot, wire

EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "evidence"
PAIRS = [
    (getattr(wire, name), getattr(snapshot, name))
    for name in [
        "NodeInfo",
        "Disk",
        "Host",
        "GpuProcess",
        "XidEvent",
        "Gpu",
        "Percentiles",
        "Latency",
        "ModelStats",
        "Engine",
        "JobStep",
        "Job",
        "TrtEngine",
        "Snapshot",
    ]
]


@pytest.mark.parametrize(("model", "struct"), PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_the_struct_has_the_models_fields_and_defaults(
    model: type[BaseModel], struct: type[msgspec.Struct]
) -> None:
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    assert list(fields) == list(model.model_fields), "same fields, same order"
    for name, info in model.model_fields.items():
        f = fields[name]
        if info.is_required():
            assert f.required, name
        elif info.default_factory is not None:
            assert f.default_factory is not msgspec.NODEFAULT, name
            made = f.default_factory()
            expected = info.default_factory()  # type: ignore[call-arg]
            assert (snapshot.plain(made) if isinstance(made, msgspec.Struct) else made) == (
                expected.model_dump() if isinstance(expected, BaseModel) else expected
            ), name
        else:
            assert f.default == info.default, name


@pytest.mark.parametrize("recorded", sorted(EVIDENCE.glob("*-agent-once.json")))
def test_a_real_agents_snapshot_reads_the_same_both_ways(recorded: Path) -> None:
    """Snapshots the agent printed on real H200s (the device machine)."""
    body = recorded.read_bytes()
    ours = snapshot.plain(snapshot.decode_snapshot(body))
    theirs = wire.Snapshot.model_validate_json(body).model_dump()
    assert ours == theirs


def test_a_bad_snapshot_says_where() -> None:
    body = json.loads((EVIDENCE / "h200x2-agent-once.json").read_text())
    body["gpus"][1]["index"] = "one"
    with pytest.raises(snapshot.SnapshotError, match=r"\$\.gpus\[1\]\.index"):
        snapshot.decode_snapshot(json.dumps(body))
    with pytest.raises(snapshot.SnapshotError, match="not JSON"):
        snapshot.decode_snapshot(b'{"node": ')


def test_unknown_keys_from_a_newer_agent_are_ignored() -> None:
    body = json.loads((EVIDENCE / "h200x2-agent-once.json").read_text())
    body["future_key"] = {"x": 1}
    body["gpus"][0]["future_field"] = 3
    snap = snapshot.decode_snapshot(json.dumps(body))
    assert snap.gpus[0].index == 0


def test_snapshots_are_not_tracked_by_the_garbage_collector() -> None:
    """Why the console reads into these: 1,000 snapshots a second would otherwise fill
    the collector's young generation (issue 15)."""
    snap = snapshot.decode_snapshot((EVIDENCE / "h200x2-agent-once.json").read_bytes())
    assert not gc.is_tracked(snap)
    assert not gc.is_tracked(snap.gpus[0])
    assert gc.is_tracked(wire.Snapshot.model_validate_json(msgspec.json.encode(snap)))
