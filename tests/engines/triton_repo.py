"""A Triton model repository whose one model is a TEST DOUBLE for the TensorRT-LLM ensemble.

Triton itself is real (the `tritonserver` binary from nvidia-pytriton, 2.51.0). Only the model
is a stand-in: a decoupled Python-backend model with the input and output names of the
TensorRT-LLM `ensemble` model, so the console's Triton paths (generate, generate_stream, stats,
metrics, load/unload) run against the real server without a GPU.

The model "generates" the words " tok0 tok1 ..." (max_tokens of them) with a short delay
between tokens. With `stream` true it sends one response per token; without it, exactly one
response with the whole text, as Triton's plain `generate` requires. A `text_input` that
starts with "FAIL" gets an error response, for error-rate paths.
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
    count: 1
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
"""TEST DOUBLE for the TensorRT-LLM ensemble model (Triton itself is real).

Decoupled: each request is answered from its own thread, so concurrent streams overlap the way
they do under in-flight batching.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _text_response(text):
    out = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[out])


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        delay_ms = float(params.get("token_delay_ms", {}).get("string_value", "5"))
        self.delay_s = delay_ms / 1000.0
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self._answer, args=(request,), daemon=True)
            thread.start()
            self.threads.append(thread)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        if isinstance(prompt, bytes):
            prompt = prompt.decode(errors="replace")
        max_tokens = int(
            pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0]
        )
        stream_tensor = pb_utils.get_input_tensor_by_name(request, "stream")
        stream = bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor else False

        if prompt.startswith("FAIL"):
            error = pb_utils.TritonError("test double asked to fail: " + prompt[:40])
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return

        words = []
        for i in range(max(max_tokens, 0)):
            if sender.is_cancelled():
                break
            time.sleep(self.delay_s)
            word = " tok%d" % i
            words.append(word)
            if stream:
                sender.send(_text_response(word))
        if not stream:
            sender.send(_text_response("".join(words)))
        sender.send(flags=FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
'''


def write_repo(root: Path, name: str = "ensemble", token_delay_ms: float = 5.0) -> Path:
    """Write a model repository under `root` holding the test-double model `name`.

    Returns `root`. Layout: `root/NAME/config.pbtxt` and `root/NAME/1/model.py`.
    """
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        CONFIG_PBTXT.format(name=name, token_delay_ms=token_delay_ms)
    )
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    return root
