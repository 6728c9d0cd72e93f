"""The chat-completions client against a real HTTP server on 127.0.0.1 (scripted replies)."""

import time

import pytest

from jaxrl_post.rewards import llm_client as lc


def _client(server, **kw):
  cfg = dict(base_url=server.url, model="test-model", api_key="sk-test", timeout_s=2.0,
             max_retries=2, backoff_s=0.0)
  cfg.update(kw)
  return lc.ChatClient(lc.ChatConfig(**cfg))


MSG = [{"role": "user", "content": "hello"}]


def test_request_format_and_reply(chat_server):
  chat_server.script = [{"text": "hi there",
                         "usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                   "total_tokens": 10}}]
  client = _client(chat_server, temperature=0.5, max_tokens=64,
                   extra_body={"reasoning_effort": "high"})
  reply = client.chat(MSG)
  assert reply.text == "hi there" and reply.tokens == 10 and client.tokens_used == 10
  (req,) = chat_server.requests
  assert req["path"] == "/v1/chat/completions"
  assert req["headers"]["Authorization"] == "Bearer sk-test"
  assert req["body"] == {"model": "test-model", "messages": MSG, "temperature": 0.5,
                         "max_tokens": 64, "reasoning_effort": "high"}


def test_retries_server_errors_and_rate_limits(chat_server):
  chat_server.script = [{"status": 500}, {"status": 429, "headers": {"Retry-After": "0"}},
                        {"text": "ok"}]
  assert _client(chat_server).chat(MSG).text == "ok"
  assert len(chat_server.requests) == 3


def test_retries_exhausted(chat_server):
  chat_server.script = [{"status": 503}] * 3
  with pytest.raises(lc.ChatError, match="after 3 attempts"):
    _client(chat_server).chat(MSG)
  assert len(chat_server.requests) == 3


def test_non_retryable_status_fails_at_once_without_leaking_the_key(chat_server):
  chat_server.script = [{"status": 401, "body": {"error": {"message": "bad key"}}}]
  with pytest.raises(lc.ChatError) as e:
    _client(chat_server, api_key="sk-very-secret").chat(MSG)
  assert e.value.status == 401 and "bad key" in str(e.value)
  assert "sk-very-secret" not in str(e.value)
  assert len(chat_server.requests) == 1
  assert "sk-very-secret" not in repr(lc.ChatConfig(base_url="u", model="m",
                                                    api_key="sk-very-secret"))


def test_timeout_then_retry(chat_server):
  chat_server.script = [{"text": "late", "delay": 1.5}, {"text": "on time"}]
  t = time.monotonic()
  assert _client(chat_server, timeout_s=0.5).chat(MSG).text == "on time"
  assert time.monotonic() - t < 5
  assert len(chat_server.requests) == 2


def test_malformed_response(chat_server):
  chat_server.script = [{"body": b"not json"}]
  with pytest.raises(lc.ChatError, match="malformed"):
    _client(chat_server).chat(MSG)
  chat_server.script = [{"body": {"choices": []}}]
  with pytest.raises(lc.ChatError, match="malformed"):
    _client(chat_server).chat(MSG)


def test_token_budget(chat_server):
  chat_server.script = [{"text": "a", "usage": {"total_tokens": 80}},
                        {"text": "b", "usage": {"total_tokens": 50}}]
  client = _client(chat_server, token_budget=100, max_tokens=1000)
  client.chat(MSG)
  assert client.remaining_tokens() == 20
  client.chat(MSG)
  assert chat_server.requests[1]["body"]["max_tokens"] == 20  # capped by what is left
  with pytest.raises(lc.TokenBudgetExceeded):
    client.chat(MSG)
  assert len(chat_server.requests) == 2  # nothing sent once the budget is spent


def test_usage_missing_is_estimated(chat_server):
  chat_server.script = [{"text": "x" * 40}]
  client = _client(chat_server)
  client.chat([{"role": "user", "content": "y" * 40}])
  assert client.tokens_used == 21  # (40 + 40) // 4 + 1


def test_config_from_env():
  env = {"OPENAI_BASE_URL": "http://a/v1", "OPENAI_MODEL": "m1", "OPENAI_API_KEY": "k",
         "JAXRL_POST_LLM_MODEL": "m2", "JAXRL_POST_LLM_TOKEN_BUDGET": "500"}
  cfg = lc.ChatConfig.from_env(env, timeout_s=3.0)
  assert (cfg.base_url, cfg.model, cfg.api_key, cfg.token_budget, cfg.timeout_s) == (
      "http://a/v1", "m2", "k", 500, 3.0)
  with pytest.raises(ValueError, match="JAXRL_POST_LLM_BASE_URL"):
    lc.ChatConfig.from_env({})
