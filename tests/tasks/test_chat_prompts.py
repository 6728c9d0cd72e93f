"""`tasks.chat.ChatTask` against `transformers`' `apply_chat_template`, and stopping at end of turn.

The stand-in Qwen3 checkpoint (`standin.write_standin_checkpoint`) has Qwen3's template features:
an optional system turn, the generation prompt, and the `enable_thinking` switch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post import tokenizers as tk
from jaxrl_post.models.hf import load_hf
from jaxrl_post.sampling.rollout import FINISH_NAMES
from jaxrl_post.sampling.sampler import Sampler
from jaxrl_post.standin import END_OF_TURN, PAD_TOKEN
from jaxrl_post.tasks.base import get_task
from jaxrl_post.tasks.chat import ChatTask
from jaxrl_post.tasks.data import prepare_task_dataset

SYSTEM = "Please reason step by step, and put your final answer after ####."


@pytest.fixture(scope="module")
def tok(standin):
  return tk.HFTokenizer.from_dir(standin)


@pytest.fixture(scope="module")
def hf_tok(standin):
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(str(standin))


def _hf_ids(hf_tok, messages, **kwargs):
  out = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
  return list(out["input_ids"] if hasattr(out, "keys") else out)  # a BatchEncoding in v5


@pytest.mark.parametrize("system_prompt", ["", SYSTEM])
@pytest.mark.parametrize("enable_thinking", [False, True])
def test_prompt_equals_transformers(tok, hf_tok, system_prompt, enable_thinking):
  inner = get_task("arith")
  task = ChatTask(inner, tok, system_prompt=system_prompt,
                  template_kwargs={"enable_thinking": enable_thinking})
  for index in range(3):
    plain = inner.make_example("train", index)
    record = task.make_example("train", index)
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
      {"role": "user", "content": plain["prompt"].rstrip("\n")}]
    expected = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=enable_thinking)
    assert record["prompt"] == expected
    assert tok.encode(record["prompt"]) == _hf_ids(hf_tok, messages,
                                                   enable_thinking=enable_thinking)
    # Only the prompt changes; the inner task's fields and verdicts stay.
    assert {k: v for k, v in record.items() if k != "prompt"} == {
      k: v for k, v in plain.items() if k != "prompt"}
    demo = plain["demonstration"]
    assert task.reward(record, demo) == inner.reward(plain, demo)
  assert (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" in record["prompt"]) == bool(system_prompt)
  assert record["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                   if not enable_thinking else "<|im_start|>assistant\n")


def test_fingerprint_covers_the_rendering(tok, standin, tmp_path):
  inner = get_task("arith")
  base = ChatTask(inner, tok, template_kwargs={"enable_thinking": False})
  fp = base.fingerprint()
  assert {k: v for k, v in fp.items() if k != "chat"} == inner.fingerprint()
  assert fp["chat"]["template_kwargs"] == {"enable_thinking": False}
  others = [
    ChatTask(inner, tok, system_prompt=SYSTEM, template_kwargs={"enable_thinking": False}),
    ChatTask(inner, tok, template_kwargs={"enable_thinking": True}),
    ChatTask(inner, tok),
  ]
  # The same features with a different template text.
  for name in ("tokenizer.json", "tokenizer_config.json"):
    (tmp_path / name).write_bytes((standin / name).read_bytes())
  (tmp_path / "chat_template.jinja").write_text(
    (standin / "chat_template.jinja").read_text() + "{#- a comment #}")
  others.append(ChatTask(inner, tk.HFTokenizer.from_dir(tmp_path),
                         template_kwargs={"enable_thinking": False}))
  fingerprints = [fp] + [t.fingerprint() for t in others]
  assert len({repr(sorted(f["chat"].items())) for f in fingerprints}) == len(fingerprints)
  assert base.name == "arith" and base.knobs() == inner.knobs() and base.splits is None


def test_stored_records_are_rendered(tok, tmp_path):
  task = ChatTask(get_task("arith"), tok, system_prompt=SYSTEM)
  builder = prepare_task_dataset(task, str(tmp_path), num_examples={"train": 3})
  source = builder.as_data_source("train")
  assert source[1]["prompt"].decode() == task.make_example("train", 1)["prompt"]
  plain = prepare_task_dataset(get_task("arith"), str(tmp_path), num_examples={"train": 3})
  assert plain.data_dir != builder.data_dir  # another fingerprint, another directory


def test_mixture_domains_are_forwarded_and_rendered(tok):
  inner = get_task("mixture")
  task = ChatTask(inner, tok)
  assert task.domains == inner.domains
  domain = inner.domains[0]
  record = task.make_domain_example(domain, "test", 2)
  assert record["prompt"] == task.render(inner.make_domain_example(domain, "test", 2)["prompt"])
  assert task.domain_of(record) == domain
  with pytest.raises(AttributeError, match="has no domains"):
    ChatTask(get_task("arith"), tok).make_domain_example("arith", "test", 0)


def test_tokenizer_without_template_or_a_failing_template(standin, tmp_path):
  with pytest.raises(ValueError, match=r"\(CharTokenizer\) has no chat template: expected"):
    ChatTask(get_task("arith"), tk.CharTokenizer())
  for name in ("tokenizer.json", "tokenizer_config.json"):
    (tmp_path / name).write_bytes((standin / name).read_bytes())
  (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('no user turns here') }}")
  broken = tk.HFTokenizer.from_dir(tmp_path)
  with pytest.raises(ValueError, match=rf"tokenizer \({tmp_path}\) failed to render .*"
                                       "TemplateError: no user turns here"):
    ChatTask(get_task("arith"), broken)
  with pytest.raises(ValueError, match="must be JSON-able"):
    ChatTask(get_task("arith"), tk.HFTokenizer.from_dir(standin), template_kwargs={"x": object()})


@pytest.fixture(scope="module")
def uniform_model(standin):
  """The stand-in with its final norm's scale zeroed: every logit is 0, so every token is
  equally likely and greedy decoding picks id 0 (`<|endoftext|>`)."""
  model = load_hf(standin)
  model.final_norm.scale[...] = jnp.zeros_like(model.final_norm.scale[...])
  return model


def test_sampler_stops_at_the_end_of_turn_ids(tok, uniform_model):
  im_end, endoftext = tok.token_to_id(END_OF_TURN), tok.token_to_id(PAD_TOKEN)
  assert endoftext == 0 and tok.eos_id == im_end
  prompt = ChatTask(get_task("arith"), tok).make_example("test", 0)["prompt"]

  sampler = Sampler(uniform_model, tok, max_prompt_len=64)
  assert sampler.eos_ids == tok.end_ids == (im_end, endoftext)
  # One shape for every call below (64 rows, 32 new tokens): fewer compilations.
  shape = dict(n_samples_per_prompt=64, max_new_tokens=32)
  # Greedy picks <|endoftext|>, an end id only through generation_config.json: one token, "eos".
  out = sampler.generate(None, [prompt], greedy=True, **shape)
  assert set(np.asarray(out.lengths).tolist()) == {1}
  assert {FINISH_NAMES[r] for r in np.asarray(out.finish_reason)} == {"eos"}
  # With the eos alone (<|im_end|>) the same rows run to the budget.
  eos_only = Sampler(uniform_model, tok, max_prompt_len=64, eos_ids=[tok.eos_id])
  out = eos_only.generate(None, [prompt], greedy=True, **shape)
  assert set(np.asarray(out.lengths).tolist()) == {32}
  assert {FINISH_NAMES[r] for r in np.asarray(out.finish_reason)} == {"length"}

  # Sampling uniformly: a row ends exactly at its first end id, <|im_end|> included, and the
  # decoded completion drops it (special tokens are skipped).
  out = sampler.generate(None, [prompt], temperature=1.0, rng=jax.random.key(0), **shape)
  tokens, mask = np.asarray(out.completion_tokens), np.asarray(out.completion_mask)
  lengths, reasons = np.asarray(out.lengths), np.asarray(out.finish_reason)
  ended_on = []
  for row in range(tokens.shape[0]):
    ids = tokens[row, :lengths[row]].tolist()
    is_end = [i in (im_end, endoftext) for i in ids]
    assert not any(is_end[:-1])
    assert FINISH_NAMES[reasons[row]] == ("eos" if is_end[-1] else "length")
    if is_end[-1]:
      ended_on.append(ids[-1])
    assert mask[row].sum() == lengths[row]
  assert im_end in ended_on and endoftext in ended_on
  texts = sampler.decode_text(out)
  row = [r for r in range(len(texts)) if tokens[r, lengths[r] - 1] == im_end][0]
  assert texts[row] == tok.decode(tokens[row, :lengths[row] - 1])
  assert END_OF_TURN not in "".join(texts) and PAD_TOKEN not in "".join(texts)
