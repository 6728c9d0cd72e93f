"""LLM proposer over a real socket (scripted server) and the offline proposer."""

import pytest

from jaxrl_post.rewards import llm_client, module_code, prompts
from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards import proposers as pr

FEATURES = {"v": (), "a": (2,)}
INFO = pr.TaskInfo(task="Run forward fast.", environment="A toy runner.", feature_spec=FEATURES,
                   feature_docs={"v": "forward speed (m/s)"})


def _llm(server, **kw):
  client = llm_client.ChatClient(llm_client.ChatConfig(base_url=server.url, model="m",
                                                       backoff_s=0.0, max_retries=0, **kw))
  return pr.LLMProposer(client), client


def test_llm_reflection_init_improve_weights(llm_server):
  proposer, client = _llm(llm_server)
  state = mp.PoolState()
  reflection = proposer.reflect(INFO, state, iteration=1)
  assert "running fast" in reflection and "forward speed" in reflection
  prompts_sent = [r["body"]["messages"][-1]["content"] for r in llm_server.requests]
  assert "Run forward fast." in prompts_sent[0]
  assert "v: () — forward speed (m/s)" in prompts_sent[1]  # features documented for the LLM

  plan = proposer.init_pool(INFO, reflection, iteration=1, variant=0, num_variants=2)
  assert [(o.op, o.name) for o in plan.ops] == [("ADD", "speed_bonus"), ("ADD", "effort_penalty"),
                                               ("ADD", "sneaky"), ("ADD", "log_speed")]
  code_prompt = llm_server.requests[3]["body"]["messages"][-1]["content"]
  assert "def upright_bonus(f)" in code_prompt and "a: (2,)" in code_prompt  # the contract
  assert "import os" in plan.ops[2].code  # proposed as is; vetting rejects it later

  pool, _, rejected = mp.apply_plan(
      mp.Pool(), plan, iteration=1, variant=0,
      accept=lambda c: (True, "", "ok") if "import" not in c else (False, "import", "validate"))
  assert pool.names == ("speed_bonus", "effort_penalty", "log_speed")
  assert [r.name for r in rejected] == ["sneaky"]

  plan2 = proposer.improve_pool(INFO, pool, "reflect", state, iteration=2, variant=1,
                                num_variants=2)
  assert plan2.rationale == "push speed"
  assert [(o.op, o.name) for o in plan2.ops] == [("ADD", "target_speed"),
                                                ("MODIFY", "speed_bonus")]
  modify_prompt = llm_server.requests[-1]["body"]["messages"][-1]["content"]
  assert "jnp.tanh(f[\"v\"])" in modify_prompt  # MODIFY shows the current code
  module_code.validate_module_code(plan2.ops[1].code, FEATURES)

  weights = proposer.propose_weights(INFO, pool, "reflect", iteration=2, variant=0, k=5)
  assert weights == {"speed_bonus": 2.0, "effort_penalty": 1.0}  # unknown / bad entries dropped
  assert client.tokens_used == 100 * len(llm_server.requests)


def test_llm_feedback_reflection_kinds(llm_server):
  proposer, _ = _llm(llm_server)
  state = mp.PoolState(iteration=1, history=[{"iteration": 1, "kind": "failed", "variants": []}],
                       failures=[mp.FailureRecord(iteration=1, variant=0, kind="rollback",
                                                  detail="all below threshold")])
  assert proposer.reflect(INFO, state, iteration=2) == "Keep the speed term, retune it."
  prompt = llm_server.requests[-1]["body"]["messages"][-1]["content"]
  assert "rolled back" in prompt and "all below threshold" in prompt
  assert pr.feedback_kind(state) == "failed"


def test_llm_errors_become_proposer_errors(chat_server):
  proposer, _ = _llm(chat_server, token_budget=50)
  chat_server.script = [{"text": "no json here", "usage": {"total_tokens": 10}}]
  with pytest.raises(pr.ProposerError, match="no JSON"):
    proposer.init_pool(INFO, "r", iteration=1, variant=0, num_variants=1)
  chat_server.script = [{"text": "{\"weights\": [1, 2]}", "usage": {"total_tokens": 60}}]
  with pytest.raises(pr.ProposerError, match="weights"):
    proposer.propose_weights(INFO, mp.Pool(), "r", iteration=1, variant=0, k=2)
  with pytest.raises(pr.ProposerError, match="budget"):
    proposer.propose_weights(INFO, mp.Pool(), "r", iteration=1, variant=0, k=2)


def test_offline_proposer_is_deterministic_and_valid():
  prop = pr.OfflineProposer(pr.OfflineProposerConfig(seed=3))
  plan = prop.init_pool(INFO, "r", iteration=1, variant=0, num_variants=2)
  assert plan == prop.init_pool(INFO, "r", iteration=1, variant=0, num_variants=2)
  assert plan != prop.init_pool(INFO, "r", iteration=1, variant=1, num_variants=2)
  assert 4 <= len(plan.ops) <= 6
  for op in plan.ops:
    module_code.validate_module_code(op.code, FEATURES)
  pool, _, rejected = mp.apply_plan(mp.Pool(), plan, accept=lambda c: (True, "", "ok"),
                                    iteration=1, variant=0)
  assert not rejected
  state = mp.PoolState(iteration=1, pool=pool)
  for v in range(6):
    improve = prop.improve_pool(INFO, pool, "r", state, iteration=2, variant=v, num_variants=6)
    new, applied, rejected = mp.apply_plan(pool, improve, accept=lambda c: (True, "", "ok"),
                                           iteration=2, variant=v)
    assert applied and not rejected, improve
    for op in improve.ops:
      if op.code:
        assert module_code.validate_module_code(op.code, FEATURES).function_name == op.name
  w = prop.propose_weights(INFO, pool, "r", iteration=1, variant=0, k=2)
  assert len(w) == 2 and sum(w.values()) == pytest.approx(1.0)


def test_offline_mutation_changes_constants_only():
  import numpy as np

  code = 'def m(f):\n  return -jnp.sum(jnp.square(f["a"][..., 0:1]), axis=-1) / 0.5 + 2.0\n'
  out = pr._perturb_constants(code, np.random.default_rng(0), 0.5)
  assert out != code and "f['a'][..., 0:1]" in out and "axis=-1" in out
  module_code.validate_module_code(out, FEATURES)


def test_prompt_helpers():
  assert prompts.extract_code("bla\n```python\ndef f(x):\n  return x\n```\nmore") == (
      "def f(x):\n  return x")
  assert prompts.extract_json('sure: {"a": [1, 2]} thanks') == {"a": [1, 2]}
  assert prompts.extract_json('```json\n{"b": 1}\n```') == {"b": 1}
  with pytest.raises(ValueError):
    prompts.extract_json("nothing")
  with pytest.raises(KeyError):
    prompts.render(prompts.TASK_REFLECTION, task="t")
  assert "jnp.linalg.norm" in prompts.contract(FEATURES)
