"""OpenAI completions and chat, translated to Triton's generate endpoints and back.

Triton's generate extension (`POST /v2/models/{m}/generate` and `.../generate_stream`,
SSE) takes the TensorRT-LLM ensemble's inputs as JSON: `text_input`, `max_tokens`,
`stream`, and optional sampling inputs; it answers `text_output`. Chat messages are
rendered into one `text_input` with the deployment's template (`chat_template`, one line
per message with {role} and {content}, then `chat_prompt_suffix`).

Triton does not say why generation stopped: the finish reason is "length" when the
stream carried `max_tokens` chunks (one per token, as the ensemble streams), else "stop".
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from console.core.config.load import Deployment

DEFAULT_MAX_TOKENS = 16
# OpenAI sampling parameters the ensemble takes under its own input names.
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "seed": "random_seed"}


class BadRequest(ValueError):
    """A request that cannot be translated; str() is the OpenAI error message."""


def prompt_of(data: dict[str, Any], chat: bool, dep: Deployment) -> str:
    if not chat:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt: this deployment takes one prompt string")
        return prompt
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: wants a non-empty list")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise BadRequest(f"messages[{i}]: wants a role and a text content")
        lines.append(
            dep.chat_template.format(role=message.get("role", "user"), content=message["content"])
        )
    return "".join(lines) + dep.chat_prompt_suffix


def request(data: dict[str, Any], chat: bool, dep: Deployment, model: str) -> tuple[str, dict]:
    """(path, JSON body) of the Triton request for an OpenAI one."""
    stream = data.get("stream") is True  # as the gateway reads it: 1 or "yes" is no stream
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens", DEFAULT_MAX_TOKENS))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("max_tokens: wants a positive integer")
    body: dict[str, Any] = {
        "text_input": prompt_of(data, chat, dep),
        "max_tokens": max_tokens,
        "stream": stream,
    }
    for ours, theirs in SAMPLING.items():
        if data.get(ours) is not None:
            body[theirs] = data[ours]
    path = f"/v2/models/{model}/generate" + ("_stream" if stream else "")
    return path, body


class Shaper:
    """Builds OpenAI response and chunk objects for one request."""

    def __init__(self, chat: bool, model: str, max_tokens: int) -> None:
        self.chat, self.model, self.max_tokens = chat, model, max_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.chunks = 0

    def _choice(self, text: str | None, finish: str | None, stream: bool) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if stream:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if self.chunks == 1 and text is not None:
                delta["role"] = "assistant"
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text or ""},
            "logprobs": None,
            "finish_reason": finish,
        }

    def response(self, text: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(text, "stop", stream=False)],
            "usage": None,  # Triton does not count tokens for us: unknown, not 0
        }

    def chunk(self, text: str | None, finish: str | None = None) -> bytes:
        if text is not None:
            self.chunks += 1
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(text, finish, stream=True)],
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    def last(self) -> bytes:
        finish = "length" if self.chunks >= self.max_tokens else "stop"
        return self.chunk(None, finish) + b"data: [DONE]\n\n"


def text_of(event: bytes) -> str:
    """The text_output of one Triton SSE `data:` payload; raises BadRequest on an error."""
    data = json.loads(event)
    if "error" in data:
        raise BadRequest(str(data["error"]))
    text = data.get("text_output", "")
    return text if isinstance(text, str) else str(text)
