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


# Scale-aware offline proposer: features of CartPole-like scales.
STATS = {"v": (0.01, 0.05), "a": (0.0, 0.05)}
INFO_STATS = pr.TaskInfo(task="Run forward fast.", environment="A toy runner.",
                         feature_spec=FEATURES, feature_docs={"v": "forward speed (m/s)"},
                         feature_stats=STATS)
_POWER = {t[0]: t[3] for t in pr._SCALAR_TEMPLATES}


def _constants(code):
  """(a, b) of a scalar template's code: the divisor after '/ ' and the target after 'f[..] -'."""
  import re

  a = float(re.search(r"/ ([0-9.e+-]+)", code).group(1))
  m = re.search(r'f\["v"\] ([-+]) ([0-9.e+-]+)', code)
  b = None if m is None else float(m.group(2)) * (-1.0 if m.group(1) == "+" else 1.0)
  return a, b


def test_offline_constants_follow_the_feature_scale():
  import numpy as np

  prop = pr.OfflineProposer()
  lengths, targets = [], []
  for i in range(200):
    name, _, code = prop._draw_module(INFO_STATS, np.random.default_rng(i), feature="v")
    a, b = _constants(code)
    lengths.append(a ** (1.0 / _POWER[name.rsplit("_", 1)[-1]]))  # a = L or L².
    if b is not None:
      targets.append(b)
  lengths, targets = np.array(lengths), np.array(targets)
  # L = 0.05 · lognormal(0, 0.5): of the order of the std, not of 1.
  assert 0.03 < np.exp(np.mean(np.log(lengths))) < 0.08
  assert np.all((lengths > 0.05 * np.exp(-2.5)) & (lengths < 0.05 * np.exp(2.5)))
  # b = 0.01 + 0.05 · N(0, 0.5).
  assert len(targets) > 20 and np.all(np.abs(targets - 0.01) < 0.125)
  assert abs(np.median(targets) - 0.01) < 0.02
  # Without stats: the scale-blind draws (constants around 1).
  blind = [_constants(prop._draw_module(INFO, np.random.default_rng(i), feature="v")[2])[0]
           for i in range(200)]
  assert 0.5 < np.exp(np.mean(np.log(blind))) < 2.0


def test_offline_scale_aware_is_deterministic_and_valid():
  prop = pr.OfflineProposer(pr.OfflineProposerConfig(seed=5))
  plan = prop.init_pool(INFO_STATS, "r", iteration=1, variant=0, num_variants=2)
  assert plan == prop.init_pool(INFO_STATS, "r", iteration=1, variant=0, num_variants=2)
  assert plan != prop.init_pool(INFO_STATS, "r", iteration=1, variant=1, num_variants=2)
  assert plan != prop.init_pool(INFO, "r", iteration=1, variant=0, num_variants=2)
  pool, _, rejected = mp.apply_plan(mp.Pool(), plan, accept=lambda c: (True, "", "ok"),
                                    iteration=1, variant=0)
  assert not rejected
  state = mp.PoolState(iteration=1, pool=pool)
  for v in range(4):
    improve = prop.improve_pool(INFO_STATS, pool, "r", state, iteration=2, variant=v,
                                num_variants=4)
    assert improve == prop.improve_pool(INFO_STATS, pool, "r", state, iteration=2, variant=v,
                                        num_variants=4)
    for op in improve.ops:
      if op.code:
        assert module_code.validate_module_code(op.code, FEATURES).function_name == op.name


def _all_template_codes():
  """Every library template on every feature, with scale-blind and scale-aware constants."""
  codes = []
  for f, shape in FEATURES.items():
    templates = pr._VECTOR_TEMPLATES if shape else pr._SCALAR_TEMPLATES
    length, centre = pr.feature_scale(STATS[f], shape)
    for t in templates:
      for a, b in [(0.5, -0.3), (pr._sig(length ** t[3]), centre), (1e-3, 0.0)]:
        codes.append(pr.render_template(t, f, a, b)[2])
  return codes


def test_every_template_is_allowed_and_finite():
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(0)
  samples = [{k: jnp.asarray(scale * rng.standard_normal((64,) + s), jnp.float32)
              for k, s in FEATURES.items()} for scale in (0.05, 1.0, 100.0)]
  samples.append({k: jnp.zeros((64,) + s, jnp.float32) for k, s in FEATURES.items()})
  codes = _all_template_codes()
  assert len(codes) == 3 * (len(pr._SCALAR_TEMPLATES) + len(pr._VECTOR_TEMPLATES))
  for code in codes:
    info = module_code.validate_module_code(code, FEATURES)
    fn = module_code.compile_module(code, FEATURES)
    for feats in samples:
      out = np.asarray(fn(feats))
      assert out.shape == (64,) and np.all(np.isfinite(out)), code
      if info.function_name.endswith("_band"):  # Bounded, non-negative bonus.
        assert np.all((out >= 0.0) & (out <= 1.0)), code


def test_every_template_passes_the_sandbox(sandbox_root):
  from jaxrl_post.rewards import sandbox as sb

  codes = _all_template_codes()
  verdicts = sb.vet_modules(codes, FEATURES, config=sb.VetConfig(root=sandbox_root,
                                                                 per_module_s=10))
  assert all(v.ok for v in verdicts), [(c, v) for c, v in zip(codes, verdicts) if not v.ok]


def test_stats_in_prompts():
  text = prompts.format_features(FEATURES, {"v": "forward speed (m/s)"}, STATS)
  assert "v: () — forward speed (m/s) (typical value 0.01 ± 0.05 under random actions)" in text
  assert "a: (2,) — (typical value per component 0 ± 0.05 under random actions)" in text
  assert prompts.format_features(FEATURES, {"v": "x"}, {"v": (float("nan"), 1.0)}) == (
      "  - v: () — x\n  - a: (2,)")
  assert "typical value 0.01 ± 0.05" in prompts.contract(FEATURES, None, STATS)
  assert "typical value" in pr.OfflineProposer().reflect(INFO_STATS, mp.PoolState(), iteration=1)
