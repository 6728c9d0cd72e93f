"""`ChatTask`: any task's prompts rendered with a checkpoint's chat template.

A chat model is trained and evaluated on conversations, not raw text: the prompt it should see
for a record is the checkpoint's own template applied to one user turn (after an optional
system turn), ending with the header that opens the assistant's turn. Every method feeds
`record["prompt"]` to the sampler, so rendering it here, once per record, covers them all:

  task = ChatTask(get_task("arith"), tokenizer, system_prompt="Reason step by step.",
                  template_kwargs={"enable_thinking": False})
  task.make_example("train", 0)["prompt"]
  # '<|im_start|>system\\nReason step by step.<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n'
  # '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'

The rendering is `HFTokenizer.apply_chat_template(messages, add_generation_prompt=True,
**template_kwargs)`, which matches `transformers`. Everything else (answers, meta, rewards,
splits, a mixture's domains) is the inner task's: completions are scored exactly as without the
template. The fingerprint adds the template's SHA-256, the system prompt and the template
arguments, so a stored dataset (`tasks.data`, keyed by the fingerprint) never mixes renderings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_post.tasks import base

# A user turn rendered once when the task is built, so a template that cannot render fails
# before any data is written or any program compiled.
_PROBE = "What is 1 + 1?"


class ChatTask(base.Task):
  """Wraps `inner` so that each record's `prompt` is a rendered one-turn conversation.

  Messages: `[{"role": "system", "content": system_prompt}]` when `system_prompt` is not empty,
  then `{"role": "user", "content": <inner prompt without its trailing newlines>}`.

  Attributes the wrapper does not define (a mixture's `domains`, `domain_of`, `pool_sizes`, a
  task's `golden_negative`, ...) are the inner task's; `make_domain_example` renders too.
  """

  def __init__(self, inner: base.Task, tokenizer: Any, *, system_prompt: str = "",
               template_kwargs: Mapping[str, Any] | None = None):
    """Checks that the tokenizer's template renders, then wraps `inner`.

    Args:
      inner: the task whose records to render.
      tokenizer: an `HFTokenizer` (anything with `chat_template` and `apply_chat_template`).
      system_prompt: the system turn's text; "" leaves the turn out (the template's default,
        if it has one, applies).
      template_kwargs: further template variables, e.g. `{"enable_thinking": False}` (Qwen3);
        JSON-able values, since they enter the fingerprint.

    Raises:
      ValueError: naming the tokenizer's directory, when it has no chat template, the template
        fails to render, or `template_kwargs` is not JSON-able.
    """
    self._inner = inner
    self._tokenizer = tokenizer
    self._system_prompt = str(system_prompt)
    self._template_kwargs = dict(template_kwargs or {})
    where = getattr(tokenizer, "source_dir", None) or type(tokenizer).__name__
    self._where = where
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
      raise ValueError(
        f"the tokenizer ({where}) has no chat template: expected a checkpoint directory with "
        "chat_template.jinja or a 'chat_template' key in tokenizer_config.json")
    try:
      json.dumps(self._template_kwargs, sort_keys=True)
    except TypeError as e:
      raise ValueError(f"chat template kwargs {self._template_kwargs!r} must be JSON-able "
                       f"(they enter the task fingerprint): {e}") from None
    self._template_sha256 = hashlib.sha256(template.encode("utf-8")).hexdigest()
    self.render(_PROBE)

  @property
  def name(self) -> str:
    """The inner task's name: records keep naming the task that made them."""
    return self._inner.name

  @property
  def inner(self) -> base.Task:
    return self._inner

  @property
  def system_prompt(self) -> str:
    return self._system_prompt

  @property
  def template_kwargs(self) -> dict[str, Any]:
    return dict(self._template_kwargs)

  def messages(self, prompt: str) -> list[dict[str, str]]:
    """The conversation a prompt becomes: optional system turn, then one user turn."""
    turns = [{"role": "system", "content": self._system_prompt}] if self._system_prompt else []
    return turns + [{"role": "user", "content": prompt.rstrip("\n")}]

  def render(self, prompt: str) -> str:
    """`prompt` as the template renders it, ending with the assistant's generation prompt.

    Raises:
      ValueError: naming the tokenizer's directory and the template's own message.
    """
    try:
      return self._tokenizer.apply_chat_template(
        self.messages(prompt), add_generation_prompt=True, tokenize=False,
        **self._template_kwargs)
    except Exception as e:  # Templates are user code: any failure is reported the same way.
      raise ValueError(
        f"the chat template of the tokenizer ({self._where}) failed to render a one-turn "
        f"conversation with add_generation_prompt=True and kwargs {self._template_kwargs!r}: "
        f"{type(e).__name__}: {e}") from e

  def _rendered(self, record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "prompt": self.render(record["prompt"])}

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    return self._rendered(self._inner.make_example(split, index))

  def make_domain_example(self, domain: str, split: str, local_index: int) -> dict[str, Any]:
    """A mixture's record of one domain, rendered (AttributeError when `inner` has no domains)."""
    if not hasattr(self._inner, "make_domain_example"):
      raise AttributeError(f"task {self.name!r} has no domains (no make_domain_example)")
    return self._rendered(self._inner.make_domain_example(domain, split, local_index))

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    return self._inner.reward(record, completion)

  def reward_batch(self, batch: Mapping[str, Sequence[Any]], completions: Sequence[str]
                   ) -> tuple[np.ndarray, np.ndarray]:
    return self._inner.reward_batch(batch, completions)

  @property
  def splits(self) -> list[str] | None:
    return self._inner.splits

  def num_examples(self, split: str) -> int | None:
    return self._inner.num_examples(split)

  def knobs(self) -> dict[str, Any]:
    """The inner task's knobs (the rendering is not a task knob; it is in `fingerprint`)."""
    return self._inner.knobs()

  def fingerprint(self) -> dict[str, Any]:
    """The inner fingerprint plus what determines the rendering."""
    return {**self._inner.fingerprint(), "chat": {
      "template_sha256": self._template_sha256,
      "system_prompt": self._system_prompt,
      "template_kwargs": self._template_kwargs,
    }}

  def __getattr__(self, attr: str) -> Any:
    # Only called for attributes not found on the wrapper: delegate to the inner task. Names
    # starting with "_" are not forwarded (and `_inner` itself may not exist yet, e.g. while
    # unpickling), so a missing private attribute fails here rather than recursing.
    if attr.startswith("_"):
      raise AttributeError(attr)
    return getattr(self._inner, attr)

  def __repr__(self) -> str:
    return (f"ChatTask({self._inner!r}, system_prompt={self._system_prompt!r}, "
            f"template_kwargs={self._template_kwargs!r})")
