"""The OpenAI request shapes this server understands (other fields are ignored), its error
answer (APIError, in OpenAI's error shape) and the server-sent-event framing."""

import json

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    seed: int | None = None
    dflash: bool = True  # false: plain decoding (greedy or sampling) through mlx-lm, for comparisons
    dflash_policy: str | None = None  # "adaptive" | "fixed": this request's verification policy (None: the server's)
    n: int = 1
    logprobs: bool | int | None = None


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_ContentPart] | None = None


class ChatRequest(_Base):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list | None = None
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": true}; thinking is off unless asked


class CompletionRequest(_Base):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class APIError(Exception):
    """A request the server refuses, answered in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str = None,
        code: str = None,
        kind: str = "invalid_request_error",
        headers: dict = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


CUT_OFF = APIError(
    503,
    "the stream was cut off: this client read it too slowly, and the server does not "
    "hold a run's text back for long; read the stream as it comes",
    code="client_too_slow",
    kind="server_error",
)


def internal_error(e: Exception) -> APIError:
    return APIError(500, f"internal error: {type(e).__name__}: {e}".splitlines()[0], kind="server_error")


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"
