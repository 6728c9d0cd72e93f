"""methods/ice.py: contexts → prompts, the loss's KL term against `losses.ice_filtered_forward_kl`
on hand-built logits and on logits of an independent full forward pass (full vocabulary and
top-K), micro-batch additivity, the gradient path (only the bare-prompt pass), β_S = 0 = plain
PPO, the NLL variant, metrics by context, one step's wiring (prompts, bare layout, advantages,
filter rewards, teacher support), config errors and the method state.

The model is the `tiny` preset (char vocabulary, random weights, logit chunks of 3 positions so
the chunked scorer is exercised); the teacher is the same model with perturbed weights (the
"old" parameters the method scores after rollout), so teacher and student differ. ≈ 60-75 s on
2 cores shared with a background job (mostly compilation).
"""

import doctest
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post import advantages as advantages_lib
from jaxrl_post import losses, tokenizers
from jaxrl_post.config_args import load_module
from jaxrl_post.methods import grpo, ice
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.parallel.axes import DEFAULT_RULES
from jaxrl_post.parallel.mesh import make_placement
from jaxrl_post.rewards.verifiers import RewardFailures
from jaxrl_post.sampling import scoring
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.objectives import make_policy_loss
from jaxrl_post.training.ppo import with_normalizers
from jaxrl_post.training.train_state import create_train_state

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = ("Hint: carry.", "Hint: check.", "Be careful!")


def _config_module():
  return load_module(ROOT / "configs" / "ice.py", "ice_config")


def _config(arg="", **ice_overrides):
  config = _config_module().get_config(arg)
  config.ice.update(ice_overrides)
  return config


@pytest.fixture(scope="module")
def setup():
  """Tiny model and tokenizer, its old (teacher) parameters, and a 4-row batch."""
  tok = tokenizers.get_tokenizer("char")
  model = CausalLM(get_model_config("tiny", vocab_size=tok.vocab_size, logit_chunk_size=3),
                   rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  old = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape, x.dtype),
                     params)
  questions = ["Q: 12+7=\n", "Q: 3-45=\n"]
  contexts = np.array([0, 1, 3, 2])  # rows 0-1: question 0, rows 2-3: question 1
  bare = [questions[i // 2] for i in range(4)]
  cond = ice.context_prompts(questions, contexts, INSTRUCTIONS)
  width = 32
  cond_tokens, cond_mask = tokenizers.pad_batch([tok.encode(p) for p in cond],
                                                pad_id=tok.pad_id, max_len=width)
  bare_tokens, bare_mask = tokenizers.pad_batch([tok.encode(p) for p in bare],
                                                pad_id=tok.pad_id, max_len=width)
  completions = ["#### 19", "#### 1", "#### -42", "7"]
  t = 8
  comp = np.full((4, t), tok.pad_id, np.int32)
  comp_mask = np.zeros((4, t), bool)
  for i, text in enumerate(completions):
    ids = (tok.encode(text) + [tok.eos_id])[:t]
    comp[i, :len(ids)], comp_mask[i, :len(ids)] = ids, True
  batch = dict(prompt_tokens=cond_tokens, prompt_mask=cond_mask, completion_tokens=comp,
               completion_mask=comp_mask, uncond_prompt_tokens=bare_tokens,
               uncond_prompt_mask=bare_mask,
               # Rows 1 and 2 correct and conditioned (kept); row 0 correct but bare (not
               # distilled); row 3 wrong.
               ice_rewards=ice.distill_rewards(np.array([1.0, 1.0, 1.0, 0.0]), contexts))
  return dict(tok=tok, model=model, graphdef=graphdef, params=params, old=old, batch=batch,
              contexts=contexts)


def _teacher(setup, k):
  """The method's teacher: the old parameters scored on the conditioned layout, top-K."""
  b = setup["batch"]
  out = scoring.score(setup["graphdef"], setup["old"], b["prompt_tokens"], b["prompt_mask"],
                      b["completion_tokens"], b["completion_mask"], top_k=k)
  return dict(ice_teacher_ids=out.topk_ids, ice_teacher_logp=out.topk_logp, old_logp=out.logp)


def _full_logp(graphdef, params, prompt, prompt_mask, comp, comp_mask):
  """Independent reference: one plain forward with logits everywhere, completion slice."""
  model = nnx.merge(graphdef, params)
  tokens = jnp.concatenate([prompt, comp], axis=1)
  mask = jnp.concatenate([prompt_mask, comp_mask], axis=1)
  logits = model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  p = prompt.shape[1]
  return jax.nn.log_softmax(logits[:, p - 1:-1].astype(jnp.float32), axis=-1)


def _zero_rl(model, batch):
  del model
  return jnp.zeros((), jnp.float32), {}


def _with_total(batch):
  return dict(batch, ice_kept_total=ice.kept_total(batch, 1.0))


def _kl_loss(setup, k, **kw):
  vocab = setup["tok"].vocab_size
  return ice.make_ice_loss(_zero_rl, beta=1.0, renormalize=k < vocab, **kw)


def test_doctests():
  result = doctest.testmod(ice, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted >= 5 and result.failed == 0


def test_contexts_become_prompts():
  contexts = losses.assign_contexts(3, 4, 3, rng=np.random.default_rng(0))
  prompts = ice.context_prompts(["Q: 1+2=\n", "Q: 3+4=\n", "Q: 5+6=\n"], contexts,
                                INSTRUCTIONS)
  assert len(prompts) == 12
  for row, (c, p) in enumerate(zip(contexts, prompts)):
    question = ["Q: 1+2=\n", "Q: 3+4=\n", "Q: 5+6=\n"][row // 4]
    assert p == (question if c == 0 else f"{INSTRUCTIONS[c - 1]}\n{question}")
    assert p.endswith("=\n")  # the answer still starts right after the prompt
  # G = N + 1: every group sees every context exactly once.
  assert all(sorted(contexts[g * 4:(g + 1) * 4]) == [0, 1, 2, 3] for g in range(3))
  with pytest.raises(ValueError, match=r"contexts must be in \[0, 3\]"):
    ice.context_prompts(["a"], np.array([0, 4]), INSTRUCTIONS)


def test_method_contexts_depend_on_seed_and_step_only():
  method = ice.ICE(_config("runlocal"))
  a, b = method.contexts(5, 7), ice.ICE(_config("runlocal")).contexts(5, 7)
  np.testing.assert_array_equal(a, b)  # a resumed step draws the same contexts
  assert a.shape == (5 * 4,) and set(a.tolist()) <= {0, 1, 2, 3}
  assert not np.array_equal(method.contexts(5, 7), method.contexts(5, 8))


@pytest.mark.parametrize("k", [0, 8])  # 0: the whole vocabulary; 8: top-8, renormalised
def test_kl_term_equals_the_pure_function_on_reference_logits(setup, k):
  vocab = setup["tok"].vocab_size
  k = k or vocab
  b = dict(setup["batch"], **_teacher(setup, k))
  value, aux = jax.jit(_kl_loss(setup, k))(setup["model"], _with_total(b))
  # Reference: full-vocabulary log-probs from plain forwards of both layouts.
  teacher = _full_logp(setup["graphdef"], setup["old"], b["prompt_tokens"], b["prompt_mask"],
                       b["completion_tokens"], b["completion_mask"])
  student = _full_logp(setup["graphdef"], setup["params"], b["uncond_prompt_tokens"],
                       b["uncond_prompt_mask"], b["completion_tokens"], b["completion_mask"])
  if k < vocab:  # the teacher's top-K support, gathered from the full distributions
    ids = b["ice_teacher_ids"]
    np.testing.assert_allclose(b["ice_teacher_logp"], np.take_along_axis(teacher, ids, -1),
                               atol=1e-5)
    teacher, student = (np.take_along_axis(x, ids, -1) for x in (teacher, student))
  expected, expected_aux = losses.ice_filtered_forward_kl(
    teacher, student, b["ice_rewards"], b["completion_mask"], renormalize=k < vocab)
  assert float(expected) > 1e-3  # teacher and student differ
  np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux["ice_kl"], expected, rtol=1e-5, atol=1e-6)
  # Kept: rows 1 and 2 (correct, with an instruction), all their completion tokens.
  kept = b["completion_mask"][1].sum() + b["completion_mask"][2].sum()
  assert float(aux["ice_kept_tokens"]) == float(expected_aux.kept_tokens) == kept


class _BagOfWords:
  """A hand-built LM over V = 4 ids: the logits after position t are Σ_{s ≤ t, unmasked}
  E[token_s] (so the prompt, instruction included, shifts every completion position)."""

  config = SimpleNamespace(logit_chunk_size=2)
  E = np.array([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, -1.0, 0.5], [0.0, 2.0, 0.0, -1.0],
                [-0.5, 0.0, 1.0, 0.0]], np.float32)

  def __call__(self, tokens, *, attention_mask, embeddings=None, return_logits=True):
    del embeddings, return_logits
    return jnp.cumsum(jnp.asarray(self.E)[tokens] * attention_mask[..., None], axis=1)

  def output_logits(self, hidden):
    return hidden


def test_kl_term_on_hand_built_logits():
  """Prompts: bare [0, 1] (0 = padding), with an instruction [3, 1]; completion [2, 1, 3]."""
  E = _BagOfWords.E
  comp = np.array([[2, 1, 3], [2, 1, 3]], np.int32)
  comp_mask = np.array([[True, True, True], [True, True, False]])
  bare = np.array([[0, 1], [0, 1]], np.int32)
  # Student logits at completion positions t = 0, 1, 2: the bare prefix sums, by hand.
  z_student = np.stack([E[1], E[1] + E[2], E[1] + E[2] + E[1]])
  # Teacher (the "old" conditioned pass) given as data: any log-probs over the 4 ids.
  z_teacher = np.stack([E[3] + E[1], E[3] + E[1] + E[2], 0.5 * (E[3] + E[1] + E[2] + E[1])])
  log_softmax = lambda z: z - np.log(np.exp(z).sum(-1, keepdims=True))  # noqa: E731
  t_logp, s_logp = log_softmax(z_teacher), log_softmax(z_student)
  batch = dict(prompt_tokens=np.array([[3, 1], [3, 1]], np.int32),
               prompt_mask=np.ones((2, 2), bool), completion_tokens=comp,
               completion_mask=comp_mask, uncond_prompt_tokens=bare,
               uncond_prompt_mask=bare > 0, ice_rewards=np.array([1.0, 1.0], np.float32),
               ice_teacher_ids=np.broadcast_to(np.arange(4, dtype=np.int32), (2, 3, 4)),
               ice_teacher_logp=np.broadcast_to(t_logp, (2, 3, 4)).astype(np.float32))
  batch = _with_total(batch)
  value, aux = ice.make_ice_loss(_zero_rl, beta=1.0)(_BagOfWords(), batch)
  # KL per position, by hand; kept: 3 tokens of row 0, 2 of row 1.
  kl = (np.exp(t_logp) * (t_logp - s_logp)).sum(-1)
  expected = (kl.sum() + kl[:2].sum()) / 5
  np.testing.assert_allclose(value, expected, rtol=1e-5)
  pure, _ = losses.ice_filtered_forward_kl(np.broadcast_to(t_logp, (2, 3, 4)),
                                           np.broadcast_to(s_logp, (2, 3, 4)),
                                           batch["ice_rewards"], comp_mask)
  np.testing.assert_allclose(value, pure, rtol=1e-5)
  assert float(aux["ice_kept_tokens"]) == 5.0


def test_micro_batches_add_up_to_the_batch(setup):
  """Σ w is the mini-batch's (`ice_kept_total`): halves of the rows sum to the whole."""
  b = _with_total(dict(setup["batch"], **_teacher(setup, 8)))
  loss = jax.jit(_kl_loss(setup, 8))
  whole, _ = loss(setup["model"], b)
  halves = [loss(setup["model"], {k: (v if k == "ice_kept_total" else v[rows])
                                  for k, v in b.items()})[0]
            for rows in (slice(0, 2), slice(2, 4))]
  np.testing.assert_allclose(sum(halves), whole, rtol=1e-6)


def test_kl_gradient_flows_only_through_the_unconditioned_pass(setup):
  b = _with_total(dict(setup["batch"], **_teacher(setup, setup["tok"].vocab_size)))
  graphdef = setup["graphdef"]
  loss = _kl_loss(setup, setup["tok"].vocab_size)

  def of_params(params, batch):
    return loss(nnx.merge(graphdef, params), batch)[0]

  grads = jax.grad(of_params)(setup["params"], b)

  # Reference: the gradient of KL(teacher ‖ student(θ)) with the teacher a constant.
  teacher = _full_logp(graphdef, setup["old"], b["prompt_tokens"], b["prompt_mask"],
                       b["completion_tokens"], b["completion_mask"])

  def reference(params):
    student = _full_logp(graphdef, params, b["uncond_prompt_tokens"], b["uncond_prompt_mask"],
                         b["completion_tokens"], b["completion_mask"])
    return losses.ice_filtered_forward_kl(teacher, student, b["ice_rewards"],
                                          b["completion_mask"])[0]

  expected = jax.grad(reference)(setup["params"])
  for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-4
  # The conditioned layout does not enter the KL's gradient: other prompts, same gradient.
  scrambled = dict(b, prompt_tokens=b["prompt_tokens"][::-1], prompt_mask=b["prompt_mask"][::-1])
  for g, e in zip(jax.tree.leaves(jax.grad(of_params)(setup["params"], scrambled)),
                  jax.tree.leaves(grads)):
    np.testing.assert_array_equal(g, e)
  # Nor does any gradient reach the teacher's log-probs (stop-gradient in the pure loss).
  d_teacher = jax.grad(lambda t: loss(setup["model"], dict(b, ice_teacher_logp=t))[0])(
    jnp.asarray(b["ice_teacher_logp"]))
  assert float(jnp.abs(d_teacher).max()) == 0.0


def _ppo_batch(setup):
  b = dict(setup["batch"], **_teacher(setup, 8))
  b["adv"] = np.array([1.0, -0.5, 0.5, -1.0], np.float32)
  return _with_total(with_normalizers(b))


def test_beta_zero_is_the_plain_ppo_loss(setup):
  rl = make_policy_loss(policy_loss="grpo", loss_agg_mode="token-mean", epsilon_low=0.2,
                        epsilon_high=0.28)
  assert ice.make_ice_loss(rl, beta=0.0) is rl  # no second pass at all
  b = _ppo_batch(setup)
  plain, _ = rl(setup["model"], b)
  # β_S > 0 with nothing kept (no correct conditioned row): the PPO loss and its gradient.
  nothing = dict(b, ice_rewards=np.zeros(4, np.float32), ice_kept_total=np.float32(0))
  with_kl = ice.make_ice_loss(rl, beta=0.5, renormalize=True)
  value, aux = with_kl(setup["model"], nothing)
  np.testing.assert_allclose(value, plain, rtol=1e-6)
  assert float(aux["ice_kept_tokens"]) == 0.0 and float(aux["ice_kl"]) == 0.0
  graphdef = setup["graphdef"]

  def grad_of(fn, batch):
    return jax.grad(lambda p: fn(nnx.merge(graphdef, p), batch)[0])(setup["params"])

  for g, e in zip(jax.tree.leaves(grad_of(with_kl, nothing)), jax.tree.leaves(grad_of(rl, b))):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
  # With kept rows: PPO + β_S · KL exactly.
  value, aux = with_kl(setup["model"], b)
  np.testing.assert_allclose(value, plain + 0.5 * aux["ice_term"], rtol=1e-6)
  assert float(aux["ice_term"]) > 0


def test_nll_variant(setup):
  b = _ppo_batch(setup)
  value, aux = jax.jit(ice.make_ice_loss(_zero_rl, beta=1.0, kl="nll"))(setup["model"], b)
  student = scoring.score_model(setup["model"], b["uncond_prompt_tokens"],
                                b["uncond_prompt_mask"], b["completion_tokens"],
                                b["completion_mask"])
  expected = losses.ice_nll_surrogate(student.logp, b["ice_rewards"], b["completion_mask"])
  np.testing.assert_allclose(value, expected, rtol=1e-5)
  # ice_kl: the sampled-token estimate Σ w (old_logp − logp^S) / Σ w of the forward KL.
  w = np.asarray(losses.correct_token_weights(b["ice_rewards"], b["completion_mask"]))
  gap = (np.asarray(b["old_logp"]) - np.asarray(student.logp)) * w
  np.testing.assert_allclose(aux["ice_kl"], gap.sum() / w.sum(), rtol=1e-4, atol=1e-6)


def test_metrics_by_context():
  method = ice.ICE(_config("runlocal"))
  contexts = np.array([0, 1, 2, 3, 0, 1, 2, 3])
  correct = np.array([1, 0, 1, 1, 0, 0, np.nan, 1], np.float64)
  mask = np.ones((8, 2), bool)
  out = method.ice_metrics({"train/ice_kl": 0.25}, mask, contexts, correct, correct,
                           ice.distill_rewards(correct, contexts))
  assert out["ice/kl"] == 0.25
  assert out["ice/reward_by_context/0"] == 0.5 and out["ice/reward_by_context/1"] == 0.0
  assert out["ice/reward_by_context/2"] == 1.0  # the NaN row is left out
  assert out["ice/reward_without_instruction"] == 0.5
  assert out["ice/reward_with_instruction"] == pytest.approx(3 / 5)
  assert out["ice/correct_frac"] == 4 / 8 and out["ice/distilled_frac"] == 3 / 8
  assert out["ice/kept_tokens"] == 6.0  # rows 2, 3, 7


def test_bare_rows_are_never_distilled():
  """Even the unfiltered ablation (threshold 0) keeps conditioned rows only; NaN: dropped."""
  rewards = ice.distill_rewards(np.array([0.0, 0.0, 1.0, np.nan]), np.array([0, 1, 0, 2]))
  w = losses.correct_token_weights(rewards, np.ones((4, 3), bool), correct_reward=0.0)
  np.testing.assert_array_equal(np.asarray(w).sum(-1), [0.0, 3.0, 0.0, 0.0])


def test_config_errors_name_the_key():
  with pytest.raises(ValueError, match=r"config.ice.kl='reverse' is unknown; known: forward, nll"):
    ice.ICE(_config(kl="reverse"))
  with pytest.raises(ValueError, match=r"no instruction is active: config.ice.instructions is "
                                       r"empty"):
    ice.validate_ice(_config(instructions=()))
  with pytest.raises(ValueError, match=r"config.ice.num_instructions=0\)"):
    ice.ICE(_config(num_instructions=0))
  with pytest.raises(ValueError, match=r"config.ice.num_instructions=9 but "
                                       r"config.ice.instructions has only 5"):
    ice.validate_ice(_config(num_instructions=9))
  with pytest.raises(ValueError, match=r"config.ice.filter_reward='length' is unknown"):
    ice.validate_ice(_config(filter_reward="length"))
  with pytest.raises(ValueError, match=r"config.ice.beta=-0.1 must be >= 0"):
    ice.validate_ice(_config(beta=-0.1))
  with pytest.raises(ValueError, match=r"config.ice.top_k=-1 must be >= 0"):
    ice.validate_ice(_config(top_k=-1))
  with pytest.raises(ValueError, match=r"config.ice.instructions\[1\]=' ' must be a non-empty"):
    ice.validate_ice(_config(instructions=("a", " ")))
  # The DAPO baseline: no instructions and β_S = 0 is valid.
  assert ice.validate_ice(_config("beta=0", num_instructions=0)) == ()
  assert ice.validate_ice(_config("beta=0", instructions=())) == ()


def test_config_variants_and_sweep():
  module = _config_module()
  config = module.get_config("runlocal,kl=nll,beta=0.3,steps=5")
  assert (config.ice.kl, config.ice.beta, config.steps, config.model) == ("nll", 0.3, 5, "tiny")
  assert config.ice.num_instructions == 3 and config.group_size == 4
  full = module.get_config()
  assert full.ice.beta == losses.ICE_BETA and full.group_size == 8
  assert len(ice.validate_ice(full)) == 5
  assert (full.loss.loss_agg_mode, full.loss.epsilon_low, full.loss.epsilon_high,
          full.loss.beta) == ("token-mean", 0.2, 0.28, 0.0)
  tok = tokenizers.get_tokenizer("char")
  for text in full.ice.instructions:  # fits the prompt bucket with the longest question
    assert len(tok.encode(ice.conditioned_prompt("Q: 99-99=\n", text))) <= full.prompt_len
  runs = []
  module.sweep(lambda **o: runs.append(o))
  assert len(runs) == 6
  baselines = [r for r in runs if r.get("ice.beta") == 0.0]
  assert [r["seed"] for r in baselines] == [0, 1, 2]
  assert all(r["ice.num_instructions"] == 0 for r in baselines)
  for run in runs:  # every run's config is valid
    config = module.get_config()
    for key, value in run.items():
      node = config
      *path, last = key.split(".")
      for part in path:
        node = node[part]
      node[last] = value
    ice.validate_ice(config)




def test_state_dict_round_trip(loader_position):
  method = ice.ICE(_config("runlocal"))
  method.data_iter = loader_position()
  method.data_iter.state = {"next_index": 7}
  saved = method.state_dict()
  other = ice.ICE(_config("runlocal"))
  other.data_iter = loader_position()
  other.load_state_dict(saved)
  assert other.state_dict() == {"data": {"next_index": 7}}


def test_build_model_checks_instructions_and_the_teacher_support(tmp_path, monkeypatch):
  run = SimpleNamespace(workdir=tmp_path, train_mesh=None, train_rules=DEFAULT_RULES)
  method = ice.ICE(_config("runlocal"))
  method.build_model(run)
  assert method.teacher_k == method.model.config.vocab_size  # top_k=0: the whole vocabulary
  config = _config("runlocal", top_k=8)
  method = ice.ICE(config)
  method.build_model(run)
  assert method.teacher_k == 8
  # A real vocabulary needs a top-K support (no [rows, time, vocab] teacher arrays).
  monkeypatch.setattr(ice, "FULL_VOCAB_LIMIT", 10)
  with pytest.raises(ValueError, match=r"config.ice.top_k=0 \(the whole vocabulary\) with"):
    ice.ICE(_config("runlocal")).build_model(run)
  ice.ICE(_config("runlocal,kl=nll")).build_model(run)  # the NLL surrogate needs no teacher
  config = _config("runlocal")
  config.prompt_len = 16
  with pytest.raises(ValueError, match=r"config.ice.instructions\[0\] is 29 tokens; with the "
                                       r"question it must fit config.prompt_len=16"):
    ice.ICE(config).build_model(run)


def test_step_wiring_contexts_rewards_advantages_and_layouts(tmp_path, monkeypatch):
  """One `ICE.step` on the tiny model (one device) with the verifier and the PPO phase
  replaced by stand-ins: the batch the update would get has each row's conditioned prompt,
  its bare prompt for the second pass, the GRPO advantage over each prompt's G rows, the filter
  rewards (NaN on bare rows) and the teacher's full-vocabulary support."""
  config = _config("runlocal")
  config.mesh.ici_fsdp = 1
  run = loop.Run(config=config, workdir=tmp_path,
                 placement=make_placement(config.mesh, devices=jax.devices()[:1]),
                 start=run_setup.start_point(config, str(tmp_path)))
  method = ice.ICE(config)
  model = method.build_model(run)
  run.optimizer = run_setup.build_optimizer(config, config.steps * method.updates_per_step)
  state = create_train_state(model, run.optimizer, jax.random.key(0), mesh=run.train_mesh,
                             rules=run.train_rules)
  run.graphdef = nnx.split(model)[0]
  method.start(run, state)
  correct = np.array([1, 0, 1, 0, 0, 0, 0, 1], np.float32)
  # The verifier as `methods.grpo.verify_groups` calls it.
  monkeypatch.setattr(grpo, "rewards_for", lambda task, records, texts, g, timeout_s: (
    correct, np.ones(8, np.float32), RewardFailures()))
  captured = {}

  def phase(step_fn, state, batch, **kwargs):
    captured.update(batch)
    return state, [{"loss": np.float32(0), "nonfinite_streak": np.int32(0),
                    "skipped": np.int32(0)}]

  monkeypatch.setattr(ice.ppo, "ppo_phase", phase)
  records = [{"prompt": "Q: 1+2=\n"}, {"prompt": "Q: 30-4=\n"}]
  monkeypatch.setattr(ice, "global_records", lambda data_iter: records)
  _, record = method.step(state, 5)

  tok = method.tokenizer
  contexts = method.contexts(2, 5)
  decode = lambda ids, mask: tok.decode([int(t) for t, m in zip(ids, mask) if m])  # noqa: E731
  for i in range(8):
    bare = records[i // 4]["prompt"]
    cond = ice.conditioned_prompt(bare, method.instructions[contexts[i] - 1]
                                  if contexts[i] else None)
    assert decode(captured["prompt_tokens"][i], captured["prompt_mask"][i]) == cond
    assert decode(captured["uncond_prompt_tokens"][i], captured["uncond_prompt_mask"][i]) == bare
  assert captured["uncond_prompt_tokens"].shape == captured["prompt_tokens"].shape
  # Rewards weighted correct + 0.1 format, GRPO over each prompt's 4 rows (not per row).
  expected = advantages_lib.ADVANTAGES.get("grpo")(
    jnp.stack([jnp.asarray(correct), jnp.ones(8)], 1), jnp.repeat(jnp.arange(2), 4),
    num_groups=2, eps=config.advantage_eps, reward_weights=jnp.array([1.0, 0.1]))
  np.testing.assert_allclose(captured["adv"], expected, rtol=1e-6)
  assert np.abs(captured["adv"]).max() > 0.5
  np.testing.assert_array_equal(np.isnan(captured["ice_rewards"]), contexts == 0)
  np.testing.assert_array_equal(captured["ice_rewards"][contexts > 0], correct[contexts > 0])
  vocab = model.config.vocab_size
  b, t = captured["completion_mask"].shape
  assert captured["ice_teacher_ids"].shape == captured["ice_teacher_logp"].shape == (b, t, vocab)
  np.testing.assert_allclose(np.exp(captured["ice_teacher_logp"]).sum(-1), 1.0, rtol=1e-4)
  for j in range(4):
    rows = contexts == j
    assert record[f"ice/reward_by_context/{j}"] == pytest.approx(correct[rows].mean())
