"""Executes the notebooks in runlocal mode."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]


def _execute(name: str, monkeypatch) -> list[dict]:
  """Runs notebooks/<name> as a user would (one CPU device, the small settings); its outputs."""
  notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
  monkeypatch.setenv("JAXRL_POST_ROOT", str(ROOT))
  monkeypatch.delenv("JAXRL_POST_NOTEBOOK_FULL", raising=False)
  # One CPU device in the kernel and its subprocesses, as a user would have.
  monkeypatch.setenv("XLA_FLAGS", "")
  client = NotebookClient(notebook, timeout=900, kernel_name="python3",
                          resources={"metadata": {"path": str(ROOT / "notebooks")}})
  client.execute()
  return [o for cell in notebook.cells for o in cell.get("outputs", [])]


def _has_plot(outputs) -> bool:
  return any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
             for o in outputs)


def test_quickstart_notebook_runs(monkeypatch):
  assert _has_plot(_execute("01_quickstart.ipynb", monkeypatch))


def test_gsm8k_qwen3_notebook_runs_offline_on_the_standin(monkeypatch):
  outputs = _execute("02_gsm8k_qwen3.ipynb", monkeypatch)
  text = "\n".join(o.get("text", "") for o in outputs)
  assert "<|im_start|>assistant" in text  # the chat-rendered prompt
  assert any("pass_at_1" in str(o.get("data", {})) for o in outputs)  # the evaluation's metrics
  assert _has_plot(outputs)
