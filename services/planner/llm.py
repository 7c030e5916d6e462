"""The Planner's LLM port: an OpenAI-compatible chat endpoint with structured output, or a script."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from stitchcuda.planner.settings import PlannerSettings
from stitchcuda.shared.errors import Unavailable

Message = dict[str, str]


class PlannerLLM(Protocol):
    """Answers a chat with one JSON document that should follow `schema`."""

    @property
    def name(self) -> str: ...

    def complete(self, messages: list[Message], schema: dict[str, Any]) -> str: ...


class OpenAICompatibleLLM:
    """vLLM, OpenAI or any server speaking the chat-completions API (the `openai` SDK, imported lazily)."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str = "",
        api_key: str = "EMPTY",
        timeout_s: float = 120.0,
        max_retries: int = 1,
        temperature: float = 0.0,
        response_format: str = "json_schema",
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.temperature = temperature
        self.response_format = response_format
        self._client: Any = None

    @classmethod
    def from_settings(cls, settings: PlannerSettings) -> OpenAICompatibleLLM:
        return cls(
            base_url=settings.llm_base_url,
            model=settings.llm_model,
            api_key=settings.llm_api_key.get_secret_value() or "EMPTY",
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_max_retries,
            temperature=settings.llm_temperature,
            response_format=settings.llm_response_format,
        )

    @property
    def name(self) -> str:
        return self.model or self.base_url

    def _connect(self) -> Any:
        if self._client is None:
            try:
                from openai import OpenAI
            except ImportError as exc:
                raise Unavailable(
                    "the openai package is not installed (pip install 'stitchcuda[platform]')"
                ) from exc
            self._client = OpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=self.timeout_s,
                max_retries=self.max_retries,
            )
        return self._client

    def complete(self, messages: list[Message], schema: dict[str, Any]) -> str:
        client = self._connect()
        try:
            if not self.model:  # a vLLM server serves one model: ask it which
                self.model = next(iter(client.models.list())).id
            if self.response_format == "json_schema":
                fmt: dict[str, Any] = {
                    "type": "json_schema",
                    "json_schema": {"name": "plan_refinement", "schema": schema},
                }
            else:
                fmt = {"type": "json_object"}
            response = client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, response_format=fmt
            )
        except Exception as exc:  # the SDK's errors (connection, status, timeout) all mean the same here
            raise Unavailable(f"LLM endpoint {self.base_url}: {type(exc).__name__}: {exc}") from exc
        content = response.choices[0].message.content if response.choices else None
        if not content:
            raise Unavailable(f"LLM endpoint {self.base_url} returned an empty answer")
        return str(content)


class ScriptedLLM:
    """Replays canned answers in order (tests, offline demos); records what it was asked."""

    def __init__(self, answers: Iterable[str], name: str = "scripted") -> None:
        self._answers = list(answers)
        self._name = name
        self.requests: list[list[Message]] = []

    @property
    def name(self) -> str:
        return self._name

    def complete(self, messages: list[Message], schema: dict[str, Any]) -> str:
        self.requests.append(messages)
        if not self._answers:
            raise Unavailable("the scripted LLM has no answers left")
        return self._answers.pop(0)
