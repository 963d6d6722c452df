"""Launch profiles: the agent builds the argv itself, and refuses what the profile forbids."""

from __future__ import annotations

import pytest

from console.agent.jobs.launch import LaunchError, vllm_launch
from console.core.config.load import parse_fleet

FLEET = parse_fleet("""
[fleet]
name = "t"
[[nodes]]
name = "gpu-a1"
agent = "http://127.0.0.1:9410"

[profiles.llama8b-vllm]
engine = "vllm"
node = "gpu-a1"
model = "/models/llama-3.1-8b-instruct"
served_model_name = "llama-3.1-8b-instruct"
port = 8001
gpus = [0, 1]
tensor_parallel_size = 2
args = { max_model_len = 8192, dtype = "bfloat16", enforce_eager = false }
overridable = ["port", "gpus", "args.max_model_len"]
allowed_args = ["gpu_memory_utilization"]
env = { VLLM_CPU_KVCACHE_SPACE = "1" }

[profiles.cpu]
engine = "vllm"
node = "gpu-a1"
model = "/tmp/tiny"
served_model_name = "tiny"
port = 8002
command = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
""")
PROFILE = FLEET.profiles["llama8b-vllm"]


def test_the_profile_alone_gives_vllm_serve_with_its_flags_and_gpus():
    launch = vllm_launch(PROFILE)
    assert launch.argv == (
        "vllm",
        "serve",
        "/models/llama-3.1-8b-instruct",
        "--served-model-name=llama-3.1-8b-instruct",
        "--port=8001",
        "--tensor-parallel-size=2",
        "--max-model-len=8192",
        "--dtype=bfloat16",
        # drains in-flight requests within the stop grace (30 s less 5)
        "--shutdown-timeout=25",
    )
    assert launch.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_the_module_entry_point_takes_the_model_as_a_flag():
    launch = vllm_launch(FLEET.profiles["cpu"])
    assert launch.argv[:4] == (
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model=/tmp/tiny",
    )
    assert "CUDA_VISIBLE_DEVICES" not in launch.env  # no GPUs declared: nothing derived


def test_overrides_the_profile_allows_are_applied():
    launch = vllm_launch(
        PROFILE,
        {
            "port": 9001,
            "gpus": [2, 3],
            "args.max_model_len": 4096,
            "args.gpu_memory_utilization": 0.8,
        },
    )
    assert launch.port == 9001 and launch.gpus == (2, 3)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    text = " ".join(launch.argv)
    assert "--max-model-len=4096" in text and "--gpu-memory-utilization=0.8" in text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"args.dtype": "float16"}, "args.dtype: the profile does not allow overriding it"),
        ({"model": "/etc/passwd"}, "model: the profile does not allow overriding it"),
        ({"args.trust_remote_code": True}, "args.trust_remote_code: the profile does not allow"),
        ({"port": 70000}, "port: wants a TCP port 1-65535, got 70000"),
        ({"port": "8001; rm -rf /"}, "port: wants a TCP port"),
        ({"gpus": ["0"]}, "gpus: wants a list of GPU indexes"),
        ({"gpus": [0]}, "tensor_parallel_size 2 needs 2 GPUs, the launch has 1"),
        ({"args.max_model_len": "8192 --foo"}, "args.max_model_len: wants an integer"),
    ],
)
def test_a_request_outside_the_profile_is_refused_with_its_reason(overrides, message):
    with pytest.raises(LaunchError) as info:
        vllm_launch(PROFILE, overrides)
    assert str(info.value).startswith(message)


def test_values_never_become_extra_argv_words():
    launch = vllm_launch(
        FLEET.profiles["cpu"].model_copy(update={"overridable": ["args.chat_template"]}),
        {"args.chat_template": "a b --x y"},
    )
    assert "--chat-template=a b --x y" in launch.argv  # one argv item: no shell splits it
