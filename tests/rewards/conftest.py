"""Fixtures for the reward-module tests: a scripted chat server on 127.0.0.1, sandbox roots."""

import http.server
import json
import threading
import time

import pytest


class ChatServer:
  """An OpenAI-compatible chat-completions server that replays scripted responses.

  Each entry of `script` is a dict with optional keys `status` (default 200), `body` (a JSON-able
  object or raw bytes), `text` (shorthand for a normal completion with that content), `usage`,
  `delay` (seconds before answering) and `headers`. When the script is empty, `responder(request)`
  (if set) builds the entry from the parsed request JSON. Every request is recorded with its path,
  headers and JSON body.
  """

  def __init__(self):
    self.script = []
    self.responder = None
    self.requests = []
    self.lock = threading.Lock()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_POST(self):  # noqa: N802 - http.server API.
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        try:
          body = json.loads(raw)
        except json.JSONDecodeError:
          body = None
        with server.lock:
          server.requests.append({"path": self.path, "headers": dict(self.headers),
                                  "body": body})
          entry = server.script.pop(0) if server.script else None
        if entry is None:
          entry = server.responder(body) if server.responder else {"status": 500}
        time.sleep(entry.get("delay", 0))
        status = entry.get("status", 200)
        if "text" in entry:
          payload = {"id": "x", "object": "chat.completion",
                     "choices": [{"index": 0, "message": {"role": "assistant",
                                                          "content": entry["text"]},
                                  "finish_reason": "stop"}]}
          if entry.get("usage") is not None:
            payload["usage"] = entry["usage"]
          data = json.dumps(payload).encode()
        elif isinstance(entry.get("body"), bytes):
          data = entry["body"]
        else:
          data = json.dumps(entry.get("body", {"error": {"message": "scripted"}})).encode()
        try:
          self.send_response(status)
          for k, v in entry.get("headers", {}).items():
            self.send_header(k, v)
          self.send_header("Content-Type", "application/json")
          self.send_header("Content-Length", str(len(data)))
          self.end_headers()
          self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
          pass  # The client timed out and went away (timeout tests).

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.httpd.daemon_threads = True
    self.port = self.httpd.server_address[1]
    self.url = f"http://127.0.0.1:{self.port}/v1"
    self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                   daemon=True)
    self.thread.start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def chat_server():
  server = ChatServer()
  yield server
  server.close()


@pytest.fixture
def sandbox_root(tmp_path):
  """Where sandboxed runs create their temporary directories (inside pytest's tmp_path)."""
  root = tmp_path / "sandbox"
  root.mkdir()
  yield str(root)
  # Every sandboxed run removes its directory: nothing may be left behind.
  assert list(root.iterdir()) == []


FAKE_CODE = {
    "speed_bonus": 'def speed_bonus(f):\n  return jnp.tanh(f["v"])\n',
    "effort_penalty": 'def effort_penalty(f):\n  return -jnp.sum(jnp.square(f["a"]), axis=-1)\n',
    # Hostile: must be rejected by the checks, and the run must go on.
    "sneaky": 'import os\ndef sneaky(f):\n  return os.system("id") + f["v"]\n',
    "log_speed": 'def log_speed(f):\n  return jnp.log(f["v"])\n',  # NaN on negative v
}


def fake_llm(request):
  """Answers each MLREF prompt kind the way a well-behaved (but partly hostile) LLM would."""
  prompt = request["messages"][-1]["content"]
  usage = {"total_tokens": 100}
  if "Reflect on the task" in prompt:
    return {"text": "Success means running fast with little effort.", "usage": usage}
  if "Reflect on the environment" in prompt:
    return {"text": "v is the forward speed; a is the action.", "usage": usage}
  if "Feedback on the last round" in prompt:
    return {"text": "Keep the speed term, retune it.", "usage": usage}
  if "Design the initial module pool" in prompt:
    return {"text": "Here you go:\n```json\n" + json.dumps({"modules": [
        {"name": "Speed Bonus", "description": "reward forward speed"},
        {"name": "effort_penalty", "description": "penalise effort"},
        {"name": "sneaky", "description": "definitely harmless"},
        {"name": "log_speed", "description": "log of the speed"}]}) + "\n```", "usage": usage}
  if "Write the code of module" in prompt:
    name = prompt.split("Write the code of module `")[1].split("`")[0]
    code = FAKE_CODE.get(name, f'def {name}(f):\n  return -jnp.abs(f["v"] - 1.0)\n')
    return {"text": f"```python\n{code}```", "usage": usage}
  if "Make this targeted change" in prompt:
    name = prompt.split("Module `")[1].split("`")[0]
    return {"text": f'```python\ndef {name}(f):\n  return 2.0 * jnp.tanh(f["v"] / 2.0)\n```',
            "usage": usage}
  if "Plan an improvement" in prompt:
    return {"text": "```json\n" + json.dumps({"rationale": "push speed", "ops": [
        {"op": "ADD", "name": "target_speed", "description": "stay near v = 1"},
        {"op": "MODIFY", "name": "speed_bonus", "description": "softer saturation"},
        {"op": "EXPLODE", "name": "x"}][:2]}) + "\n```", "usage": usage}
  if "Select at most" in prompt:
    return {"text": '```json\n{"weights": {"speed_bonus": 2, "effort_penalty": 1, '
                    '"ghost": 5, "target_speed": "bad"}}\n```', "usage": usage}
  return {"status": 400, "body": {"error": {"message": "unexpected prompt"}}}


@pytest.fixture
def llm_server(chat_server):
  """A chat server that plays `fake_llm` (prompt kind → canned, partly hostile, reply)."""
  chat_server.responder = fake_llm
  return chat_server
