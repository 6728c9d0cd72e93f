"""PCQA-R1 (methods/pcqa.py): templates, parsing, rewards → advantages, SFT / GRPO / regression."""

import json
import math
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import pcqa
from jaxrl_post.models import get_model_config
from jaxrl_post.models.point_cloud import PointCloudLM
from jaxrl_post.rewards import ranking
from jaxrl_post.tasks import point_clouds as pc
from jaxrl_post.tokenizers import get_tokenizer
from jaxrl_post.training import ppo
from jaxrl_post.training.base_configs import optimizer_config
from jaxrl_post.training.setup import build_optimizer
from jaxrl_post.training.train_state import create_train_state, make_train_step

ROOT = Path(__file__).resolve().parents[2]
GRID, PATCH = 4, 4  # one patch per view: 3 visual tokens, cheap to compile
COMPLETION_LEN = 96


# ---------------------------------------------------------------------------------------------
# Templates and parsing.
# ---------------------------------------------------------------------------------------------


def test_cot_template_golden_parses_and_keeps_numbers_out_of_the_rationale():
  text = pcqa.cot_completion("cone", "downsample", 2, 0.62)
  assert text == ("<pcqa_reasoning>cone, mild sparse, good.</pcqa_reasoning>"
                  "<answer>3.5</answer>")  # 1 + 4·0.62 = 3.48 → "3.5"
  assert ranking.format_reward(text) == 1.0
  assert ranking.parse_score(text) == 3.5
  rng = np.random.default_rng(0)
  for i in range(200):
    sample = pc.make_sample("syn_c", "train", i, num_points=16)
    mos01 = float(pc.normalized_mos(sample.mos, "syn_c"))
    text = pcqa.cot_completion(sample.shape, sample.distortion, sample.severity, mos01)
    reasoning = text[:text.index("<answer>")]
    assert not any(c.isdigit() for c in reasoning), text  # the MOS only in <answer>
    assert abs(ranking.parse_score(text) - pcqa.mos_to_score(mos01)) <= 0.05 + 1e-9
    base = pcqa.base_completion(rng)
    assert ranking.format_reward(base) == 1.0 and 1.0 <= ranking.parse_score(base) <= 5.0
  longest = max(len(pcqa.cot_completion(s, d, 5, 0.9)) for s in pc.SHAPES for d in pc.DISTORTIONS)
  assert longest + 1 <= COMPLETION_LEN  # + EOS: configs/pcqa_synthetic.py's completion_len


def test_quality_bands_cover_the_unit_interval():
  assert [pcqa.quality_band(x) for x in (0.0, 0.19, 0.2, 0.59, 0.8, 1.0)] == [
    "bad", "bad", "poor", "fair", "excellent", "excellent"]


def test_encode_completions_appends_eos_and_names_the_config_key_when_too_long():
  tok = get_tokenizer("char")
  tokens, mask = pcqa.encode_completions(tok, ["ab"], 4)
  assert tokens[0].tolist() == [*tok.encode("ab"), tok.eos_id, tok.pad_id]
  assert mask[0].tolist() == [True, True, True, False]
  assert pcqa.decode_completions(tok, tokens, mask) == ["ab"]
  with pytest.raises(ValueError, match="config.completion_len=4"):
    pcqa.encode_completions(tok, ["abcd"], 4)


def test_rollout_rewards_golden_and_robust_to_garbage():
  ok = lambda s: pcqa.completion("cube, clean, good.", s)  # noqa: E731
  texts = [ok(4.0), ok(2.0),  # prompt 0 (MOS₀₁ 0.75 → 4.0 on the 1–5 scale)
           "<answer>nan</answer>", "<pcqa_reasoning>x</pcqa_reasoning><answer></answer>"]
  out = ranking.rollout_rewards(texts, np.asarray([0.75, 0.25]), num_samples=2, step=0,
                             total_steps=10, alpha=1.0)
  assert out.num_unparseable == 2
  assert np.isnan(out.scores[1]).all()
  # Prompt 1 has no valid rollout, so prompt 0 has nobody to rank against: r_rk = 0.
  # Rollout 0: r_gs = exp(0) = 1, format 1 → r = 2; rollout 1: exp(−4/(2·0.25)) = e^−8, + 1.
  np.testing.assert_allclose(np.asarray(out.terms.total[0]), [2.0, 1.0 + math.exp(-8)],
                             rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(out.terms.total[1]), [0.0, 0.0])
  # K = 2: A = ±(r0 − r1)/2 / (|r0 − r1|/√2) = ±1/√2 (ddof 1); an all-zero group gets 0.
  np.testing.assert_allclose(out.adv, [2 ** -0.5, -2 ** -0.5, 0.0, 0.0], atol=1e-5)
  with pytest.raises(ValueError, match="5 completions for 2 prompts"):
    ranking.rollout_rewards(texts + ["x"], np.asarray([0.1, 0.2]), num_samples=2, step=0,
                         total_steps=1, alpha=1.0)


def test_rollout_rewards_ranking_only_reads_the_mos_order():
  texts = [pcqa.completion("a.", s) for s in (4.5, 4.0, 2.0, 2.5, 3.0, 3.5)]
  kw = dict(num_samples=2, step=3, total_steps=10, alpha=0.0)
  a = ranking.rollout_rewards(texts, np.asarray([0.9, 0.1, 0.5]), **kw)
  b = ranking.rollout_rewards(texts, np.asarray([0.99, 0.01, 0.3]), **kw)  # same order
  np.testing.assert_allclose(np.asarray(a.terms.total), np.asarray(b.terms.total), rtol=1e-6)
  np.testing.assert_allclose(a.adv, b.adv, rtol=1e-5)


def _table_module():
  return load_module(ROOT / "scripts" / "pcqa_table.py", "pcqa_table")


def test_summarize_and_aggregate_runs(tmp_path):
  tables = _table_module()
  per = {"syn_a": {"plcc": 0.9, "srcc": 0.8}, "syn_b": {"plcc": 0.5, "srcc": 0.4},
         "syn_c": {"plcc": 0.3, "srcc": 0.2}}
  flat = pcqa.summarize(per, "syn_a")
  assert flat["ood_avg/plcc"] == pytest.approx(0.4) and flat["avg/srcc"] == pytest.approx(
    1.4 / 3)
  for seed, shift in ((0, 0.0), (1, 0.1)):
    run = tmp_path / f"seed_{seed}" / "full"
    run.mkdir(parents=True)
    run.joinpath("final.json").write_text(json.dumps(
      {k: v + shift for k, v in flat.items()} | {"time/run": 10.0}))
  rank = tmp_path / "seed_0" / "rank"
  rank.mkdir(parents=True)
  rank.joinpath("final.json").write_text(json.dumps(
    flat | {"syn_b/srcc": float("nan"), "syn_b/plcc": 0.3, "syn_b/score_std": 4.4e-16,
            "syn_c/plcc": float("nan"), "syn_c/score_std": 0.3}))
  table = tables.aggregate_runs(tmp_path, ["full", "sft", "rank"], ["syn_a", "syn_b", "syn_c"],
                                source="syn_a")
  assert list(table) == ["full", "rank"] and table["full"]["num_seeds"] == 2
  np.testing.assert_allclose(table["full"]["ood_avg/plcc"], [0.45, 0.05])
  np.testing.assert_allclose(table["full"]["avg/srcc"], [1.4 / 3 + 0.05, 0.05])
  # A constant predictor on syn_b (score std ~0: NaN SRCC, a spurious PLCC) counts 0 there.
  np.testing.assert_allclose(table["rank"]["syn_b/srcc"], [0.0, 0.0])
  np.testing.assert_allclose(table["rank"]["syn_b/plcc"], [0.0, 0.0])
  np.testing.assert_allclose(table["rank"]["syn_b/constant"], [1.0, 0.0])
  np.testing.assert_allclose(table["rank"]["ood_avg/srcc"], [0.1, 0.0])  # (0 + 0.2) / 2
  assert np.isnan(table["rank"]["syn_c/plcc"][0])  # NaN without a constant prediction stays
  text = tables.format_table(table, ["syn_a", "syn_b", "syn_c"], source="syn_a")
  assert "| full | 2 | 0.950±0.050 / 0.850±0.050 |" in text and "syn_a (ID)" in text


# ---------------------------------------------------------------------------------------------
# The model: sampling, scoring and the three update steps.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup():
  tok = get_tokenizer("char")
  config = get_model_config("tiny", vocab_size=tok.vocab_size, num_layers=1, embed_dim=32,
                            num_heads=2, num_kv_heads=1, mlp_dim=64)
  model = PointCloudLM(config, num_views=pc.NUM_VIEWS, grid=GRID, patch=PATCH,
                       channels=len(pc.CHANNELS), width=16, depth=1, rngs=nnx.Rngs(0))
  graphdef = nnx.split(model)[0]
  text = np.asarray(tok.encode(pcqa.PROMPT), np.int32)
  kern = pcqa.build_kernels(graphdef, text, num_samples=2, max_new_tokens=COMPLETION_LEN,
                            eos_id=tok.eos_id, pad_id=tok.pad_id)
  data = pc.load_split("syn_a", "train", size=8, num_points=64, grid=GRID)
  return dict(tok=tok, model=model, graphdef=graphdef, text=jnp.asarray(text), kern=kern,
              data=data)


def _state(setup, lr=3e-3):
  optimizer = build_optimizer(type("C", (), {"optimizer": optimizer_config(lr=lr)})(), 10)
  state = create_train_state(setup["model"], optimizer, jax.random.key(0))
  # Copies: the steps donate the state, and the module's model keeps its own buffers.
  return optimizer, state.replace(params=jax.tree.map(jnp.copy, state.params))


def test_sft_steps_lower_the_loss(setup):
  optimizer, state = _state(setup)
  step = make_train_step(setup["graphdef"], pcqa.make_sft_loss(setup["text"]), optimizer,
                         shared=("num_tokens", "num_sequences"))
  batch = ppo.with_normalizers(pcqa.sft_batch(setup["tok"], setup["data"], np.arange(4),
                                             completion_len=COMPLETION_LEN, kind="cot",
                                             rng=np.random.default_rng(0)))
  losses = []
  for _ in range(4):
    state, metrics = step(state, batch)
    losses.append(float(metrics["nll"]))
  assert losses[-1] < losses[0] - 0.1, losses
  with pytest.raises(ValueError, match="unknown SFT target kind 'gold'"):
    pcqa.sft_batch(setup["tok"], setup["data"], np.arange(2), completion_len=COMPLETION_LEN,
                   kind="gold", rng=np.random.default_rng(0))


def test_sampled_logp_equals_teacher_forced_and_grpo_step_has_gradient(setup):
  kern, tok, data = setup["kern"], setup["tok"], setup["data"]
  params = nnx.state(setup["model"], nnx.Param)
  views = data.views[:3]
  out = kern.sample(params, views, jax.random.key(1))
  assert out.tokens.shape == (6, COMPLETION_LEN)
  rows = np.repeat(views, 2, axis=0)
  logp = kern.score(params, rows, out.tokens, out.mask)
  m = np.asarray(out.mask)
  np.testing.assert_allclose(np.asarray(out.logp)[m], np.asarray(logp)[m], atol=2e-4)
  # Rewards of the (untrained, unparseable) rollouts are 0; give the update real advantages.
  texts = pcqa.decode_completions(tok, out.tokens, out.mask)
  rewards = ranking.rollout_rewards(texts, data.mos01[:3], num_samples=2, step=0, total_steps=1,
                                 alpha=1.0)
  assert rewards.num_unparseable == 6 and not rewards.adv.any()
  optimizer, state = _state(setup, lr=1e-3)
  step = make_train_step(setup["graphdef"], pcqa.make_grpo_loss(setup["text"]), optimizer,
                         shared=("num_tokens", "num_sequences"))
  adv = jnp.asarray([1.0, -1.0, 0.5, -0.5, 0.0, 0.0])
  batch = ppo.with_normalizers(dict(views=rows, completion_tokens=out.tokens,
                                   completion_mask=out.mask, old_logp=out.logp, ref_logp=logp,
                                   adv=adv))
  state, metrics = step(state, batch)
  assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
  assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-4)  # on-policy first step
  assert float(metrics["kl"]) == pytest.approx(0.0, abs=1e-5)  # π = π_ref before the update


def test_regression_steps_lower_mse_and_predictions_fall_back_when_unparseable(setup):
  kern, data = setup["kern"], setup["data"]
  optimizer, state = _state(setup, lr=1e-2)
  step = make_train_step(setup["graphdef"], pcqa.make_regression_loss(setup["text"]), optimizer,
                         shared=("num_sequences",))
  batch = dict(views=data.views, mos01=jnp.asarray(data.mos01, jnp.float32),
               num_sequences=jnp.float32(len(data.mos01)))
  mses = []
  for _ in range(6):
    state, metrics = step(state, batch)
    mses.append(float(metrics["mse"]))
  assert mses[-1] < mses[0], mses
  pred = pcqa.predict_regressor(kern, state.params, data.views[:5], batch_size=4)
  assert pred.shape == (5,) and np.isfinite(pred).all()
  # The untrained LM writes no answer: every prediction is the 3.0 fall-back, and counted.
  params = nnx.state(setup["model"], nnx.Param)
  scores, bad, texts = pcqa.predict_lm(kern, params, setup["tok"], data.views[:5], batch_size=4)
  assert len(texts) == 5 and bad.all() and (scores == pcqa.FALLBACK_SCORE).all()


def test_sampled_mean_predictor_is_deterministic_and_counts_fall_backs(setup):
  kern, tok, data = setup["kern"], setup["tok"], setup["data"]
  params = nnx.state(setup["model"], nnx.Param)
  kw = dict(batch_size=4, num_samples=2)
  a = pcqa.predict_lm_sampled(kern, params, tok, data.views[:5], rng=jax.random.key(7), **kw)
  b = pcqa.predict_lm_sampled(kern, params, tok, data.views[:5], rng=jax.random.key(7), **kw)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)  # fixed rng → fixed samples (NaN == NaN here)
  means, none, scores = a
  assert scores.shape == (5, 2) and means.shape == (5,)
  # The untrained LM never writes an answer: every cloud falls back to 3.0 and is counted.
  assert none.all() and (means == pcqa.FALLBACK_SCORE).all() and np.isnan(scores).all()
  with pytest.raises(ValueError, match="expected K=3 per prompt"):
    pcqa.predict_lm_sampled(kern, params, tok, data.views[:2], batch_size=2, num_samples=3,
                            rng=jax.random.key(0))


class _Out(NamedTuple):
  tokens: np.ndarray
  mask: np.ndarray


def _stub_kernels(tok, k_samples):
  """Kernels whose rollouts are fixed texts keyed on the cloud id stored in `views[:, 0]`.

  Cloud i: samples (1 + i, 2 + i, junk, …) — except every third cloud, whose samples are all
  junk; greedy always answers 3.0 (the collapsed GRPO policy).
  """

  def encode(texts):
    return _Out(*pcqa.encode_completions(tok, texts, COMPLETION_LEN))

  def sample(params, views, rng):
    del params, rng
    texts = []
    for v in np.asarray(views)[:, 0].astype(int):
      if v % 3 == 2:
        texts += ["<answer>junk</answer>"] * k_samples
      else:
        texts += [pcqa.completion("x.", 1.0 + (v + j) % 4) if j < 2 else "junk"
                  for j in range(k_samples)]
    return encode(texts)

  def greedy(params, views):
    return encode([pcqa.completion("x.", 3.0)] * len(views))

  return pcqa.Kernels(sample, greedy, None, None)


def test_sampled_mean_drops_unparseable_samples_and_differs_from_greedy():
  tok = get_tokenizer("char")
  kern = _stub_kernels(tok, 3)
  views = np.arange(6, dtype=np.float32)[:, None]
  means, none, scores = pcqa.predict_lm_sampled(kern, None, tok, views, batch_size=4,
                                                num_samples=3, rng=jax.random.key(0))
  # Cloud i (not ≡ 2 mod 3): mean of the parseable 1 + i % 4 and 1 + (i + 1) % 4.
  np.testing.assert_allclose(means, [1.5, 2.5, 3.0, 2.5, 1.5, 3.0])
  np.testing.assert_array_equal(none, [False, False, True, False, False, True])
  assert np.isnan(scores[:, 2]).all() and np.isfinite(scores[0, :2]).all()
  greedy, bad, _ = pcqa.predict_lm(kern, None, tok, views, batch_size=4)
  assert not bad.any() and (greedy == 3.0).all() and not np.allclose(means, greedy)

  data = type("D", (), dict(views=views, mos=np.linspace(0, 1, 6)))()
  g = pcqa.evaluate_lm(kern, None, tok, {"syn_a": data}, source="syn_a", batch_size=4)
  s = pcqa.evaluate_lm(kern, None, tok, {"syn_a": data}, source="syn_a", batch_size=4,
                       mode="sampled_mean", num_samples=3, rng=jax.random.key(0))
  assert g["syn_a/score_std"] == 0.0 and s["syn_a/score_std"] > 0.3
  assert s["syn_a/unparseable"] == pytest.approx(2 / 6)  # clouds with no parseable sample
  assert s["syn_a/unparseable_samples"] == pytest.approx(10 / 18)
  with pytest.raises(ValueError, match="needs an rng"):
    pcqa.evaluate_lm(kern, None, tok, {"syn_a": data}, source="syn_a", batch_size=4,
                     mode="sampled_mean", num_samples=3)
  with pytest.raises(ValueError, match="unknown evaluation mode 'mode'"):
    pcqa.evaluate_lm(kern, None, tok, {"syn_a": data}, source="syn_a", batch_size=4, mode="mode")


def test_holdout_pools_split_the_source_between_capable_and_later_stages():
  assert pcqa.holdout_pools(400, 0.0) == {}
  pools = pcqa.holdout_pools(10, 0.3)
  np.testing.assert_array_equal(pools[pcqa.STAGE_CAPABLE], np.arange(7))
  for stage in (pcqa.STAGE_SFT, pcqa.STAGE_GRPO):
    np.testing.assert_array_equal(pools[stage], [7, 8, 9])
  assert pcqa.STAGE_BASE not in pools and pcqa.STAGE_REGRESSION not in pools
  with pytest.raises(ValueError, match="leaves 0 for the capable stage"):
    pcqa.holdout_pools(3, 0.99)
  assert len(pcqa.holdout_pools(10, 0.3, batch_size=3)[pcqa.STAGE_SFT]) == 3
  with pytest.raises(ValueError, match="3 after it, fewer than batch_size=4"):
    pcqa.holdout_pools(10, 0.3, batch_size=4)
