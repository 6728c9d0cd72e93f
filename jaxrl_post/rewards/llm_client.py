"""A small client for OpenAI-compatible chat-completions HTTP APIs (standard library only).

`POST {base_url}/chat/completions` with `{"model", "messages", "temperature", "max_tokens"}` and
`Authorization: Bearer <key>`; works with OpenAI, DeepSeek, vLLM / SGLang servers, llama.cpp and
any other server of that API. Retries connection errors, timeouts, 408 / 409 / 429 / 5xx with
exponential back-off (honouring `Retry-After`), and stops at a token budget.

Configuration comes from `ChatConfig` or the environment (`ChatConfig.from_env`):
`JAXRL_POST_LLM_BASE_URL` / `OPENAI_BASE_URL`, `JAXRL_POST_LLM_MODEL` / `OPENAI_MODEL`,
`JAXRL_POST_LLM_API_KEY` / `OPENAI_API_KEY`. The key is never logged or put in an error message.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Mapping, Sequence

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ChatError(RuntimeError):
  """The chat request failed for good (after retries, or with a non-retryable status)."""

  def __init__(self, message: str, status: int | None = None):
    super().__init__(message)
    self.status = status


class TokenBudgetExceeded(ChatError):
  """The client's token budget is spent; no request was sent."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatConfig:
  """Where and how to call the chat API.

  Attributes:
    base_url: API root, e.g. "https://api.deepseek.com/v1" or "http://127.0.0.1:8000/v1".
    model: model name sent in the request.
    api_key: bearer token (None: no Authorization header, e.g. for a local server).
    timeout_s: socket timeout of one request.
    max_retries: retries after the first attempt.
    backoff_s: first back-off; doubles per retry.
    max_backoff_s: cap on one back-off (also on `Retry-After`).
    token_budget: total tokens (prompt + completion, from the responses' `usage`, else
      estimated as characters / 4) this client may spend; None = unlimited.
    temperature: sampling temperature.
    max_tokens: completion-token cap per request.
    extra_body: extra JSON fields merged into every request (e.g. {"reasoning_effort": "high"}).
  """
  base_url: str
  model: str
  api_key: str | None = dataclasses.field(default=None, repr=False)
  timeout_s: float = 120.0
  max_retries: int = 4
  backoff_s: float = 2.0
  max_backoff_s: float = 60.0
  token_budget: int | None = None
  temperature: float = 0.8
  max_tokens: int = 4096
  extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> ChatConfig:
    """Builds a config from the environment; keyword arguments override it."""
    env = os.environ if environ is None else environ

    def pick(*names):
      for n in names:
        if env.get(n):
          return env[n]
      return None

    values = {
        "base_url": pick("JAXRL_POST_LLM_BASE_URL", "OPENAI_BASE_URL"),
        "model": pick("JAXRL_POST_LLM_MODEL", "OPENAI_MODEL"),
        "api_key": pick("JAXRL_POST_LLM_API_KEY", "OPENAI_API_KEY"),
    }
    budget = pick("JAXRL_POST_LLM_TOKEN_BUDGET")
    if budget:
      values["token_budget"] = int(budget)
    values.update(overrides)
    missing = [k for k in ("base_url", "model") if not values.get(k)]
    if missing:
      raise ValueError(f"chat config needs {missing}: set JAXRL_POST_LLM_BASE_URL / "
                       "JAXRL_POST_LLM_MODEL (or OPENAI_BASE_URL / OPENAI_MODEL) or pass them")
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class ChatResponse:
  """Text of the first choice, tokens charged for it, and the raw JSON."""
  text: str
  tokens: int
  raw: Mapping[str, Any]


class ChatClient:
  """Thread-safe chat-completions client with retries, timeouts and a token budget."""

  def __init__(self, config: ChatConfig):
    self.config = config
    self._lock = threading.Lock()
    self.tokens_used = 0
    self.requests = 0

  @property
  def endpoint(self) -> str:
    return self.config.base_url.rstrip("/") + "/chat/completions"

  def remaining_tokens(self) -> int | None:
    if self.config.token_budget is None:
      return None
    with self._lock:
      return max(0, self.config.token_budget - self.tokens_used)

  def chat(self, messages: Sequence[Mapping[str, str]], *, temperature: float | None = None,
           max_tokens: int | None = None) -> ChatResponse:
    """Sends one chat request (with retries) and returns the first choice's text.

    Args:
      messages: `[{"role": "system" | "user" | "assistant", "content": str}, ...]`.
      temperature: overrides the config.
      max_tokens: overrides the config (and is capped by the remaining budget).

    Raises:
      TokenBudgetExceeded: the budget is spent (nothing is sent).
      ChatError: non-retryable HTTP status, malformed response, or retries exhausted.
    """
    cfg = self.config
    remaining = self.remaining_tokens()
    if remaining is not None and remaining <= 0:
      raise TokenBudgetExceeded(f"token budget of {cfg.token_budget} spent")
    cap = cfg.max_tokens if max_tokens is None else max_tokens
    if remaining is not None:
      cap = min(cap, remaining)
    body = {**dict(cfg.extra_body), "model": cfg.model, "messages": [dict(m) for m in messages],
            "temperature": cfg.temperature if temperature is None else temperature,
            "max_tokens": int(cap)}
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if cfg.api_key:
      headers["Authorization"] = f"Bearer {cfg.api_key}"
    last_error = "no attempt"
    for attempt in range(cfg.max_retries + 1):
      retry_after = None
      try:
        with self._lock:
          self.requests += 1
        req = urllib.request.Request(self.endpoint, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
          payload = resp.read()
        return self._parse(payload, body)
      except urllib.error.HTTPError as e:
        detail = _snippet(e.read() if e.fp else b"")
        last_error = f"HTTP {e.code}: {detail}"
        if e.code not in _RETRY_STATUS:
          raise ChatError(f"chat request failed: {last_error}", e.code) from None
        retry_after = _retry_after(e.headers.get("Retry-After") if e.headers else None)
      except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError,
              OSError) as e:
        reason = getattr(e, "reason", e)
        last_error = f"{type(reason).__name__}: {reason}"
      if attempt < cfg.max_retries:
        delay = min(cfg.max_backoff_s, cfg.backoff_s * 2**attempt)
        if retry_after is not None:
          delay = min(cfg.max_backoff_s, max(delay, retry_after))
        time.sleep(delay)
    raise ChatError(f"chat request failed after {cfg.max_retries + 1} attempts: {last_error}")

  def _parse(self, payload: bytes, body: Mapping) -> ChatResponse:
    try:
      raw = json.loads(payload)
      message = raw["choices"][0]["message"]
      content = message.get("content")
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
      raise ChatError(f"malformed chat response: {_snippet(payload)}") from None
    if isinstance(content, list):  # Content parts: keep the text ones.
      content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    if not isinstance(content, str):
      raise ChatError(f"chat response without text content: {_snippet(payload)}")
    usage = raw.get("usage") or {}
    tokens = usage.get("total_tokens")
    if not isinstance(tokens, int):
      tokens = (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
    if not tokens:  # No usage reported: estimate ~4 characters per token.
      prompt_chars = sum(len(m.get("content", "")) for m in body["messages"])
      tokens = (prompt_chars + len(content)) // 4 + 1
    with self._lock:
      self.tokens_used += int(tokens)
    return ChatResponse(content, int(tokens), raw)


def _snippet(payload: bytes, n: int = 300) -> str:
  return payload[:n].decode("utf-8", "replace").replace("\n", " ")


def _retry_after(value: str | None) -> float | None:
  if not value:
    return None
  try:
    return max(0.0, float(value))
  except ValueError:
    pass
  try:
    when = email.utils.parsedate_to_datetime(value)
    return max(0.0, when.timestamp() - time.time())
  except (TypeError, ValueError):
    return None
