"""The LLMClient port and its adapters: an OpenAI-compatible HTTP client (vLLM, hosted endpoints) and a
scripted client for tests and offline runs.

Transport failures (connection errors, timeouts, HTTP 429 and 5xx) are retried with exponential
backoff; an answer that arrives is never retried here, however bad it is (judging it is the
parser's job). Structured output (response_format json_schema) is requested where the server takes
it; a server that rejects it with a 4xx is asked again in plain text, and remembered.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from stitchcuda.shared import metrics
from stitchcuda.shared.errors import Unavailable


@dataclass
class Completion:
    text: str
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    structured: bool = False


@dataclass
class Request:
    """One chat request as the client saw it (kept by the scripted client and in logs)."""

    messages: list[dict[str, str]]
    n: int
    model: str = ""
    response_format: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)


class LLMClient(Protocol):
    """Chat completions: `n` answers to one conversation. Raises Unavailable when the server cannot be
    reached after the configured retries."""

    def complete(
        self, messages: list[dict[str, str]], *, n: int = 1, json_schema: dict[str, Any] | None = None
    ) -> list[Completion]: ...

    @property
    def name(self) -> str: ...


class ScriptedClient:
    """Returns canned answers in order (strings, Completions, or exceptions to raise) and records requests.

    A callable script receives the Request and returns the answer; with a list the last entry repeats.
    """

    def __init__(
        self,
        script: Sequence[str | Completion | BaseException] | Callable[[Request], str | Completion] = (),
        *,
        model: str = "scripted",
    ) -> None:
        self.script = script
        self.model = model
        self.requests: list[Request] = []
        self._i = 0
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.model

    def _next(self, request: Request) -> Completion:
        with self._lock:
            if callable(self.script):
                item: str | Completion | BaseException = self.script(request)
            else:
                if not self.script:
                    raise Unavailable("the scripted LLM has no answers")
                item = self.script[min(self._i, len(self.script) - 1)]
                self._i += 1
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Completion):
            return item
        return Completion(
            text=item, finish_reason="stop", prompt_tokens=_tokens(request), completion_tokens=len(item) // 4
        )

    def complete(
        self, messages: list[dict[str, str]], *, n: int = 1, json_schema: dict[str, Any] | None = None
    ) -> list[Completion]:
        request = Request(messages=[dict(m) for m in messages], n=n, model=self.model)
        with self._lock:
            self.requests.append(request)
        return [self._next(request) for _ in range(n)]


def _tokens(request: Request) -> int:
    return sum(len(m.get("content", "")) for m in request.messages) // 4


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | openai.RateLimitError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409, 429)
    return False


class OpenAIClient:
    """An OpenAI-compatible chat endpoint through the `openai` SDK (imported on first use)."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        temperature: float = 0.7,
        top_p: float = 0.95,
        max_tokens: int = 8192,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        use_n: bool = True,
        max_parallel: int = 4,
        structured_output: str = "auto",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.use_n = use_n
        self.max_parallel = max_parallel
        self.structured_output = structured_output
        self.sleep = sleep
        self._structured_ok: bool | None = (
            None if structured_output == "auto" else structured_output == "json"
        )
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.model

    def _sdk(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import openai
                except ImportError as exc:  # the [platform] extra is not installed
                    raise Unavailable(
                        "the LLM backend needs the openai package (pip install stitchcuda[platform])"
                    ) from exc
                self._client = openai.OpenAI(
                    base_url=self.base_url,
                    api_key=self.api_key or "EMPTY",
                    timeout=openai.Timeout(self.request_timeout_s, connect=self.connect_timeout_s),
                    max_retries=0,
                )
            return self._client

    def _call(
        self, messages: list[dict[str, str]], n: int, json_schema: dict[str, Any] | None
    ) -> list[Completion]:
        import openai

        client = self._sdk()
        structured = json_schema is not None and self._structured_ok is not False
        params: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "n": n,
        }
        if structured:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "candidate", "schema": json_schema, "strict": False},
            }
        attempt = 0
        started = time.perf_counter()
        while True:
            try:
                response = client.chat.completions.create(**params)
                break
            except openai.BadRequestError as exc:
                if structured and self.structured_output == "auto":
                    # The server does not take response_format: plain text from now on.
                    self._structured_ok = False
                    structured = False
                    params.pop("response_format", None)
                    continue
                raise Unavailable(f"the LLM endpoint rejected the request: {exc}") from exc
            except Exception as exc:
                if not _retryable(exc) or attempt >= self.retries:
                    if _retryable(exc):
                        raise Unavailable(
                            f"the LLM endpoint failed after {attempt + 1} attempts: {exc}"
                        ) from exc
                    raise
                delay = min(self.backoff_max_s, self.backoff_s * (2**attempt)) * (0.5 + random.random() / 2)
                attempt += 1
                self.sleep(delay)
        if structured:
            self._structured_ok = True
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        metrics.record_llm_usage(
            prompt_tokens=prompt, completion_tokens=completion, seconds=time.perf_counter() - started
        )
        choices = list(response.choices or [])
        out = []
        for i, choice in enumerate(choices):
            text = (choice.message.content or "") if choice.message is not None else ""
            out.append(
                Completion(
                    text=text,
                    finish_reason=choice.finish_reason or "",
                    # The response's usage covers all choices: the prompt once, completions shared.
                    prompt_tokens=prompt if i == 0 else 0,
                    completion_tokens=completion // max(len(choices), 1),
                    structured=structured,
                )
            )
        return out

    def complete(
        self, messages: list[dict[str, str]], *, n: int = 1, json_schema: dict[str, Any] | None = None
    ) -> list[Completion]:
        if n <= 0:
            return []
        if self.use_n:
            got = self._call(messages, n, json_schema)
            if len(got) >= n:
                return got[:n]
            missing = n - len(got)
        else:
            got, missing = [], n
        # The server gave fewer choices than asked (or n is off): single requests in parallel.
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, missing)) as pool:
            futures = [pool.submit(self._call, messages, 1, json_schema) for _ in range(missing)]
            for f in futures:
                got.extend(f.result())
        return got
