"""The tests' fleet.toml builder (tests/support/fleet.py) writes what it is given: any
string reads back as itself, and the fleet loader sees the tables it was handed."""

from __future__ import annotations

import tomllib
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from console.core.config.load import parse_fleet
from tests.support.fleet import deployment, fleet_toml, vllm_profile

# Any text: quotes, backslashes, control characters (DEL too), line separators, astral
# characters; the surrogates no UTF-8 file can hold are left out.
TEXT = st.text(st.characters(blacklist_categories=["Cs"]))


@given(value=TEXT, key=TEXT)
@example(value='a"b\\c\n\x7f\x00é😀', key="weird key")
@example(value="", key="")
def test_any_string_and_key_read_back_as_written(value: str, key: str) -> None:
    text = fleet_toml(fleet={"name": value, key: value}, nodes=[{key: [value, 1.5, True]}])
    assert tomllib.loads(text) == {
        "fleet": {"name": value, key: value},
        "nodes": [{key: [value, 1.5, True]}],
    }


def test_nested_tables_and_arrays_of_tables_reach_the_fleet_loader(tmp_path: Path) -> None:
    profile = vllm_profile("local", tmp_path / 'a "model"', 8001, "/usr/bin/python3")
    text = fleet_toml(
        fleet={"name": "built"},
        nodes=[{"name": "local", "agent": "http://127.0.0.1:9"}],
        profiles={"tiny": profile},
        models=[
            {
                "name": "tiny",
                "slo": {"ttft_p95_ms": 500},
                "deployments": [
                    deployment("tiny-vllm", "local", "vllm", 8001, profile="tiny"),
                    deployment("tiny-trt", "local", "triton", 8000, engine_model="ensemble"),
                ],
            }
        ],
        gateway=None,  # left out
    )
    assert "[gateway]" not in text
    fleet = parse_fleet(text)
    (model,) = fleet.models
    assert [d.id for d in model.deployments] == ["tiny-vllm", "tiny-trt"]
    assert model.deployments[1].engine_model == "ensemble"
    assert model.slo.ttft_p95_ms == 500
    assert tomllib.loads(text)["profiles"]["tiny"]["model"] == str(tmp_path / 'a "model"')
    assert tomllib.loads(text)["profiles"]["tiny"]["args"] == {
        "host": "127.0.0.1",
        "max_model_len": 256,
    }
