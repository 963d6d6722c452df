"""fleet.toml: a bad file gets one clear message with path, line and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.core.config.load import ConfigError, load_fleet, parse_fleet
from tests.conftest import run_cli

GOOD = """\
[fleet]
name = "t"
environment = "prod"

[[nodes]]
name = "gpu-a1"
agent = "http://127.0.0.1:9410"
token_env = "T_TOKEN"

[[nodes]]
name = "gpu-b7"
ssh = "ops@gpu-b7"

[[models]]
name = "llama"
slo = { ttft_p95_ms = 500, itl_p95_ms = 60 }

  [[models.deployments]]
  id = "llama-trt"
  node = "gpu-a1"
  engine = "triton"
  endpoint = "http://127.0.0.1:8000"

  [[models.deployments]]
  id = "llama-vllm"
  node = "gpu-b7"
  engine = "vllm"
  endpoint = "http://127.0.0.1:8001"
"""


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_fleet(text, Path("fleet.toml"))
    return str(info.value)


def test_the_example_fleet_and_a_full_file_load():
    fleet = parse_fleet(GOOD)
    assert [n.name for n in fleet.nodes] == ["gpu-a1", "gpu-b7"]
    assert fleet.nodes[1].transport == "ssh"
    assert fleet.read_only  # prod is read-only unless the file says otherwise
    assert [d.id for _, d in fleet.deployments_on("gpu-a1")] == ["llama-trt"]
    assert load_fleet(Path(__file__).parents[1] / "fleet.toml").fleet.name == "local"


def test_an_unknown_key_names_its_line_and_the_likely_intent():
    message = error_of(GOOD.replace('agent = "http://127.0.0.1:9410"', 'agnt = "http://x"'))
    assert message.startswith("fleet.toml:7: nodes[0].agnt: unknown key 'agnt'")
    assert "did you mean 'agent'" in message


def test_an_unknown_key_in_a_nested_table_names_its_line():
    message = error_of(GOOD.replace("itl_p95_ms = 60", "itl_p95 = 60"))
    assert message.startswith("fleet.toml:16: models[0].slo.itl_p95: unknown key")


def test_a_wrong_type_says_what_it_got():
    message = error_of(GOOD.replace('environment = "prod"', "environment = 3"))
    assert message.startswith("fleet.toml:3: fleet.environment:")
    assert "got 3" in message


def test_a_deployment_naming_a_missing_node():
    message = error_of(GOOD.replace('node = "gpu-b7"', 'node = "gpu-zz"'))
    assert message == (
        "fleet.toml:26: models[0].deployments[1].node: names node 'gpu-zz', "
        "which is not in [[nodes]]"
    )


def test_duplicate_ids_and_names():
    message = error_of(GOOD.replace('id = "llama-vllm"', 'id = "llama-trt"'))
    assert (
        message == "fleet.toml:25: models[0].deployments[1].id: duplicate deployment id 'llama-trt'"
    )
    message = error_of(GOOD.replace('name = "gpu-b7"', 'name = "gpu-a1"'))
    assert message.startswith("fleet.toml:11: nodes[1].name: duplicate node name 'gpu-a1'")


def test_an_unknown_engine_and_a_bad_endpoint():
    assert "unknown engine 'sglangx'" in error_of(GOOD.replace('"triton"', '"sglangx"'))
    message = error_of(GOOD.replace('endpoint = "http://127.0.0.1:8000"', 'endpoint = "x:8"'))
    assert message == (
        "fleet.toml:22: models[0].deployments[0].endpoint: must be an http:// or "
        "https:// URL, got 'x:8'"
    )


def test_a_syntax_error_names_its_line():
    message = error_of(GOOD.replace('name = "llama"', 'name = "llama'))
    assert message.startswith("fleet.toml:15: not valid TOML")


def test_a_token_variable_that_is_not_set_names_the_line_that_named_it():
    fleet = parse_fleet(GOOD)
    with pytest.raises(ConfigError) as info:
        fleet.secret("T_TOKEN", ("nodes", 0, "token_env"), environ={})
    assert str(info.value).startswith(
        "fleet.toml:8: nodes[0].token_env: environment variable T_TOKEN is not set"
    )
    assert fleet.secret("T_TOKEN", ("nodes", 0, "token_env"), environ={"T_TOKEN": "s3"}) == "s3"


def test_the_agent_refuses_a_bad_file_with_one_line_and_a_nonzero_exit(tmp_path):
    bad = tmp_path / "fleet.toml"
    bad.write_text(GOOD.replace("[[nodes]]", "[[nodez]]", 1))
    result = run_cli("agent", "--fleet", str(bad), "--node", "gpu-a1", "--once", "--json")
    assert result.returncode == 3
    assert result.stdout == ""
    assert f"{bad}:5: nodez: unknown key 'nodez'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_agent_names_a_node_the_file_does_not_declare(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(GOOD)
    result = run_cli("agent", "--fleet", str(path), "--node", "nope", "--once", "--json")
    assert result.returncode == 3
    assert "no node named 'nope' (nodes: gpu-a1, gpu-b7)" in result.stderr


def test_a_node_without_a_way_to_reach_it_is_refused():
    with pytest.raises(ConfigError) as exc:
        parse_fleet('[fleet]\nname = "t"\n[[nodes]]\nname = "lost"\n')
    assert str(exc.value) == (
        'fleet.toml:3: nodes[0]: needs agent = "http://HOST:PORT" or ssh = "user@host"'
    )
    with pytest.raises(ConfigError) as exc:
        parse_fleet('[fleet]\nname = "t"\n[[nodes]]\nname = "x"\nssh = "root@"\n')
    assert "nodes[0]: ssh: wants user@host or host, got 'root@'" in str(exc.value)


DRILL = """
[drills.llama-fp8]
model = "llama"
deployment = "{deployment}"
checkpoint = "/models/llama"
precision = "fp8"
validate = {{ max_tokens = 8 }}
  [drills.llama-fp8.steps.build]
  argv = ["trtllm-build", "--output_dir", "{{staging}}", "{{bogus}}"]
"""


def test_drills_are_checked_with_their_lines():
    from console.agent.drills.plan import plan, values

    error = error_of(GOOD + DRILL.format(deployment="llama-trt"))
    assert "fleet.toml:36: drills.llama-fp8.steps.build: unknown placeholder {bogus}" in error
    error = error_of(GOOD + DRILL.format(deployment="llama-vllm").replace(', "{bogus}"', ""))
    assert "drills.llama-fp8.deployment: llama-vllm runs vllm; a drill rebuilds a TensorRT" in error
    error = error_of(GOOD + DRILL.format(deployment="nope").replace(', "{bogus}"', ""))
    assert "'nope' is not a deployment of llama" in error
    error = error_of(GOOD + DRILL.format(deployment="llama-trt").replace("model =", "modle ="))
    assert "unknown key 'modle'; did you mean 'model'?" in error

    fleet = parse_fleet(GOOD + DRILL.format(deployment="llama-trt").replace(', "{bogus}"', ""))
    drill = fleet.drills["llama-fp8"]
    assert drill.validate_.max_tokens == 8
    found = values(drill, "llama", Path("/s/engine"), Path("/s/ckpt"), Path("/s/engine"))
    steps = plan(drill, found)
    # fp8 on the engine pipeline: quantize.py, then the file's own build argv, filled.
    assert steps["convert"].argv is not None and "--qformat" in steps["convert"].argv
    assert steps["convert"].argv[steps["convert"].argv.index("--qformat") + 1] == "fp8"
    assert steps["build"].argv == ["trtllm-build", "--output_dir", "/s/engine"]
    # trtllm-serve serves a link named after the model (it has no --served_model_name),
    # made to point at the engine just before it starts.
    serve = steps["serve"].argv
    assert serve is not None and serve[3:5] == ["/s/served/llama", "/s/engine"]
    assert serve[5:7] == ["trtllm-serve", "/s/served/llama"]


def test_stale_reasons_name_every_fact_that_changed_and_ignore_unknowns():
    from console.agent.drills.manifest import compute_capability_of, stale_reasons

    built = {
        "versions": {
            "tensorrt_llm": "1.2.0",
            "tensorrt": "10.13",
            "cuda": "13.0",
            "driver": "580.1",
        },
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
        "model": {"weights_sha256": "a" * 64},
    }
    now = {
        "tensorrt_llm": "1.2.1",
        "tensorrt": "10.14",
        "cuda": "13.1",
        "driver": "590.2",
        "gpu": "NVIDIA B200",
        "compute_capability": "10.0",
        "weights_sha256": "b" * 64,
    }
    assert stale_reasons(built, now) == [
        "driver 580.1 → 590.2",
        "CUDA 13.0 → 13.1",
        "TensorRT 10.13 → 10.14",
        "TensorRT-LLM 1.2.0 → 1.2.1",
        "GPU NVIDIA H200 → NVIDIA B200",
        "compute capability 9.0 → 10.0",
        f"weights changed ({'a' * 12} → {'b' * 12})",
    ]
    unknown = dict.fromkeys(now)  # nothing could be read: nothing to accuse
    assert stale_reasons(built, unknown) == []
    assert compute_capability_of("NVIDIA H200") == "9.0"
    assert compute_capability_of("GB200") == "10.0"
    assert compute_capability_of("NVIDIA L40S") == "8.9"
    assert compute_capability_of("Quadro Mystery") is None


def test_a_table_the_file_makes_only_implicitly_is_placed_at_its_first_child(tmp_path):
    """Found by tests/test_properties.py: `[[nodes.ssh]]` with no `[[nodes]]` makes `nodes`
    a table, not a list, and the error had no line."""
    path = tmp_path / "fleet.toml"
    path.write_text('[fleet]\nname = "x"\n\n[[nodes.ssh]]\nhost = "a"\n')
    with pytest.raises(ConfigError) as error:
        load_fleet(path)
    assert str(error.value).startswith(f"{path}:4: nodes: "), str(error.value)


# TOML basic strings: each of these is one name as the operator wrote it, escapes undone.
HOSTILE_NAMES = [
    r"llama\nstats socket /run/x.sock mode 666 level admin",  # a new HAProxy line
    r"llama\"} or vector(1) #",  # a PromQL matcher closed early
    "llama {{ .Evil }}",  # a Prometheus template
    r"llama\u001b]8;;http://x\u001b\\",  # a terminal escape
    r"llama\u202egpj.exe",  # a bidi override
    "",
    "-llama",
    "llama x",
    "llama$HOME",
]


@pytest.mark.parametrize("bad", HOSTILE_NAMES)
@pytest.mark.parametrize(
    ("key", "replace", "line"),
    [
        ("models[0].name", 'name = "llama"', 15),
        ("models[0].deployments[0].id", 'id = "llama-trt"', 19),
        ("models[0].deployments[0].node", 'node = "gpu-a1"', 20),
        ("nodes[0].name", 'name = "gpu-a1"', 6),
    ],
)
def test_a_name_that_would_escape_a_generated_file_is_refused_with_its_line(
    bad, key, replace, line
):
    text = GOOD.replace(replace, replace.split("=")[0] + f'= "{bad}"', 1)
    message = error_of(text)
    assert message.startswith(f"fleet.toml:{line}: {key}: wants letters, digits and "), message
    assert "\n" not in message.split("; got ")[0]  # one line; the value only as repr()


def test_real_model_names_stay_valid():
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-70b", "llama3:8b",
                 "Qwen/Qwen2.5-7B-Instruct", "ens.v1", "mistral-7b-instruct-v0.3"):  # fmt: skip
        assert (
            parse_fleet(GOOD.replace('name = "llama"', f'name = "{name}"')).models[0].name == name
        )


HAPROXY = """
[[dataplanes]]
name = "edge"
kind = "haproxy"
admin_socket = "{sock}"
listen = "127.0.0.1:8000"
"""


def test_haproxy_names_and_paths_are_refused_with_their_line():
    message = error_of(GOOD + HAPROXY.format(sock=r"/run/h.sock\nstats socket /x mode 666"))
    assert message.startswith(
        "fleet.toml:33: dataplanes[0].admin_socket: wants a path without control characters "
        "or '$'; got '/run/h.sock\\nstats socket /x mode 666'"
    ), message
    assert "'$'" in error_of(GOOD + HAPROXY.format(sock="/run/$USER.sock"))
    server = 'endpoint = "http://127.0.0.1:8000"\n  server = "a b"'
    message = error_of(GOOD.replace('endpoint = "http://127.0.0.1:8000"', server))
    assert message.startswith(
        "fleet.toml:23: models[0].deployments[0].server: wants letters, digits and . _ - : "
        "(HAProxy's identifier); got 'a b'"
    ), message
    message = error_of(GOOD + HAPROXY.format(sock="/run/h.sock") + 'socket_user = "a b"\n')
    assert "dataplanes[0].socket_user: wants a user or group name" in message
    fleet = parse_fleet(GOOD + HAPROXY.format(sock="/run/haproxy/admin.sock"))
    assert (fleet.dataplanes[0].socket_user, fleet.dataplanes[0].socket_group) == (
        "engineroom", "engineroom"
    )  # fmt: skip
