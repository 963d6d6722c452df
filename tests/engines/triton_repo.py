"""A Triton model repository whose one model is a TEST DOUBLE for the TensorRT-LLM ensemble.

Triton itself is real (the `tritonserver` binary from nvidia-pytriton, 2.51.0). Only the model
is a stand-in: a decoupled Python-backend model with the input and output names of the
TensorRT-LLM `ensemble` model, so the console's Triton paths (generate, generate_stream, stats,
metrics, load/unload) run against the real server without a GPU.

The model "generates" the words " tok0 tok1 ..." (max_tokens of them) with a short delay
between tokens. With `stream` true it sends one response per token; without it, exactly one
response with the whole text, as Triton's plain `generate` requires. A `text_input` that
starts with "FAIL" gets an error response, for error-rate paths.

Each request is answered inside `execute`, so Triton's request duration and stats cover the
whole generation, as they do for the real ensemble. `instances` model instances (separate
stub processes) answer concurrently; more concurrent requests wait in Triton's queue, which
shows in `nv_inference_pending_request_count` and the queue time.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_PBTXT = """\
# TEST DOUBLE for the TensorRT-LLM "ensemble" model: same input/output names, Python backend.
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{
  decoupled: true
}}
input [
  {{
    name: "text_input"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }},
  {{
    name: "max_tokens"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }},
  {{
    name: "stream"
    data_type: TYPE_BOOL
    dims: [ 1 ]
    optional: true
  }}
]
output [
  {{
    name: "text_output"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }}
]
instance_group [
  {{
    count: {instances}
    kind: KIND_CPU
  }}
]
parameters {{
  key: "token_delay_ms"
  value: {{ string_value: "{token_delay_ms}" }}
}}
"""

# Runs inside Triton's Python backend stub, with the triton venv's numpy.
MODEL_PY = '''\
"""TEST DOUBLE for the TensorRT-LLM ensemble model (Triton itself is real)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _text_response(text):
    out = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[out])


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        delay_ms = float(params.get("token_delay_ms", {}).get("string_value", "5"))
        self.delay_s = delay_ms / 1000.0

    def execute(self, requests):
        # Decoupled: answers go through each request's response sender; execute returns None.
        for request in requests:
            self._answer(request)
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        prompt = _scalar(request, "text_input")
        if isinstance(prompt, bytes):
            prompt = prompt.decode(errors="replace")
        max_tokens = int(_scalar(request, "max_tokens"))
        stream = bool(_scalar(request, "stream"))  # optional input: None means False

        if prompt.startswith("FAIL"):
            error = pb_utils.TritonError("test double asked to fail: " + prompt[:40])
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return

        words = []
        for i in range(max(max_tokens, 0)):
            if sender.is_cancelled():  # the client went away: stop, as the real backend does
                break
            time.sleep(self.delay_s)
            word = " tok%d" % i
            words.append(word)
            if stream:
                sender.send(_text_response(word))
        if not stream:
            sender.send(_text_response("".join(words)))
        sender.send(flags=FINAL)
'''


def write_repo(
    root: Path, name: str = "ensemble", token_delay_ms: float = 5.0, instances: int = 4
) -> Path:
    """Write a model repository under `root` holding the test-double model `name`.

    Returns `root`. Layout: `root/NAME/config.pbtxt` and `root/NAME/1/model.py`.
    `token_delay_ms` is the time per generated token; `instances` how many requests are
    served at once (each instance is one Python stub process).
    """
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        CONFIG_PBTXT.format(name=name, token_delay_ms=token_delay_ms, instances=instances)
    )
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    return root
