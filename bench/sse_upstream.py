"""A minimal OpenAI-shaped upstream for the gateway benchmark: Starlette on uvicorn, every
completion streamed as 8 SSE chunks with no delay, so a proxy's cost is all that is timed.

    python bench/sse_upstream.py PORT
"""

from __future__ import annotations

import json
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHUNK = json.dumps(
    {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
     "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}]}
).encode()  # fmt: skip


async def completions(request: Request) -> Response:
    await request.body()

    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(8):
            yield b"data: " + CHUNK + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream", headers=NAME)


NAME = {"X-Upstream": sys.argv[1] if len(sys.argv) > 1 else "?"}


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "bench", "object": "model"}]})


app = Starlette(
    routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health),
        Route("/v1/models", models),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                access_log=False, loop="uvloop", http="httptools")  # fmt: skip
