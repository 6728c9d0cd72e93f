"""`setup.build_optimizer`: the schedules and the update rules (AdamW, SGD, Lion, Muon, the
Muon + Lion split), checked against hand values."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxrl_post.training import base_configs, optimizers, phases
from jaxrl_post.training import setup as run_setup


def _config(**kwargs):
  config = ml_collections.ConfigDict()
  config.optimizer = base_configs.optimizer_config(**kwargs)
  return config


def _first_update(config, grads, params):
  optimizer = run_setup.build_optimizer(config, total_steps=10)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  return np.asarray(updates)


def test_adamw_first_step_is_lr_times_sign():
  # Adam's bias-corrected first step: m̂ = g, v̂ = g², so Δ = -lr · g / (|g| + ε) ≈ -lr · sign(g).
  grads = jnp.asarray([0.3, -0.02, 0.0])
  update = _first_update(_config(lr=0.1), grads, jnp.zeros(3))
  np.testing.assert_allclose(update, [-0.1, 0.1, 0.0], atol=1e-6)


def test_sgd_step_is_lr_times_gradient_after_clipping():
  # ‖g‖ = 5 > grad_clip = 1: the gradient is scaled to norm 1 first, then Δ = -lr · g.
  grads = jnp.asarray([3.0, 4.0])
  update = _first_update(_config(name="sgd", lr=0.5), grads, jnp.zeros(2))
  np.testing.assert_allclose(update, [-0.5 * 0.6, -0.5 * 0.8], rtol=1e-6)


def test_sgd_momentum_accumulates():
  optimizer = run_setup.build_optimizer(_config(name="sgd", lr=0.1, momentum=0.5,
                                                decay_steps=10**9), total_steps=10)
  params, grads = jnp.zeros(1), jnp.asarray([0.5])
  state = optimizer.init(params)
  first, state = optimizer.update(grads, state, params)
  second, _ = optimizer.update(grads, state, params)
  # Trace t₁ = g, t₂ = 0.5·t₁ + g = 1.5 g.
  np.testing.assert_allclose([first[0], second[0]], [-0.05, -0.075], rtol=1e-5)


def test_warmup_then_cosine_to_a_tenth():
  config = _config(lr=1.0, warmup_steps=2)
  schedule_probe = run_setup.build_optimizer(config, total_steps=6)
  params = jnp.zeros(1)
  state = schedule_probe.init(params)
  sizes = []
  for _ in range(6):
    update, state = schedule_probe.update(jnp.ones(1), state, params)
    sizes.append(-float(update[0]))
  # Warm-up 0 → 1 over 2 steps, then cosine from 1 to 0.1 over the remaining 4.
  cosine = [0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(4)]
  np.testing.assert_allclose(sizes, [0.0, 0.5, *cosine], atol=1e-5)


def test_unknown_optimizer_names_the_config_key():
  with pytest.raises(ValueError, match="config.optimizer.name='adam'"):
    run_setup.build_optimizer(_config(lr=1e-3, name="adam"), total_steps=10)


def test_sgd_rejects_weight_decay():
  with pytest.raises(ValueError, match="weight_decay"):
    run_setup.build_optimizer(_config(lr=1e-3, name="sgd", weight_decay=0.1), total_steps=10)


def test_every_config_block_has_the_same_keys():
  from configs import grpo_arith, sft_arith
  for config in (grpo_arith.get_config(), sft_arith.get_config()):
    assert set(config.optimizer) == set(base_configs.optimizer_config(lr=1.0))
  assert isinstance(run_setup.build_optimizer(grpo_arith.get_config(), 10),
                    optax.GradientTransformation)


# ==== float32 optimizer state (config.optimizer.moments_dtype) ====


def _reference_adamw(config, total_steps):
  """The chain `build_optimizer` makes, built here from optax alone (float32 throughout)."""
  opt = config.optimizer
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0, peak_value=opt.lr, warmup_steps=opt.warmup_steps,
    decay_steps=total_steps, end_value=opt.lr * 0.1)
  return optax.chain(optax.clip_by_global_norm(opt.grad_clip),
                     optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                 weight_decay=opt.weight_decay))


def _trajectory(optimizer, params, grads_per_step):
  state = optimizer.init(params)
  updates = []
  for grads in grads_per_step:
    update, state = optimizer.update(grads, state, params)
    params = optax.apply_updates(params, update)
    updates.append(update)
  return params, state, updates


def _problem(dtype, steps=5, seed=0):
  rng = np.random.RandomState(seed)
  params = {"w": jnp.asarray(rng.randn(4, 3), dtype), "b": jnp.asarray(rng.randn(3), dtype)}
  grads = [{k: jnp.asarray(rng.randn(*v.shape) * 2.0, dtype) for k, v in params.items()}
           for _ in range(steps)]
  return params, grads


@pytest.mark.parametrize("moments_dtype", ["float32", "params"])
def test_adamw_equals_optax_adamw_in_float32(moments_dtype):
  """Warm-up, clipping (‖g‖ ≈ 7 > 1) and weight decay: both settings are optax's AdamW."""
  config = _config(lr=0.1, warmup_steps=2, weight_decay=0.05, moments_dtype=moments_dtype)
  params, grads = _problem(jnp.float32)
  ours, ours_state, _ = _trajectory(run_setup.build_optimizer(config, 10), params, grads)
  ref, ref_state, _ = _trajectory(_reference_adamw(config, 10), params, grads)
  for a, b in zip(jax.tree.leaves((ours, ours_state)), jax.tree.leaves((ref, ref_state))):
    np.testing.assert_array_equal(a, b)


def test_bf16_params_get_float32_moments_and_float32_arithmetic():
  """With bf16 parameters and moments_dtype=float32, the state is float32 and each update
  is the float32 AdamW update on the upcast gradients and parameters, rounded once."""
  config = _config(lr=0.1, warmup_steps=2, weight_decay=0.05)
  params, grads = _problem(jnp.bfloat16)
  optimizer = run_setup.build_optimizer(config, 10)
  state = optimizer.init(params)
  moments = [x for x in jax.tree.leaves(state) if x.ndim]
  assert len(moments) == 4 and all(m.dtype == jnp.float32 for m in moments)
  reference = _reference_adamw(config, 10)
  up = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)  # noqa: E731
  ref_state = reference.init(up(params))
  for g in grads:
    update, state = optimizer.update(g, state, params)
    ref_update, ref_state = reference.update(up(g), ref_state, up(params))
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(update))
    for a, b in zip(jax.tree.leaves(update), jax.tree.leaves(ref_update)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b.astype(jnp.bfloat16)))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)):
      np.testing.assert_array_equal(a, b)
    params = optax.apply_updates(params, update)
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params))


def test_params_moments_follow_bf16_params():
  params, _ = _problem(jnp.bfloat16)
  optimizer = run_setup.build_optimizer(_config(lr=0.1, moments_dtype="params"), 10)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(optimizer.init(params)) if x.ndim)


def test_unknown_moments_dtype_names_the_config_key():
  with pytest.raises(ValueError, match=r"config\.optimizer\.moments_dtype='bf16': expected "
                                       r"'float32' or 'params'"):
    run_setup.build_optimizer(_config(lr=1e-3, moments_dtype="bf16"), total_steps=10)


# ==== Lion, Muon and the Muon + Lion split (training.optimizers) ====


def _numpy_lion(params, grads_per_step, *, lr, b1, b2, wd, clip, cautious=False):
  """Lion by hand (arXiv 2302.06675, Algorithm 2) after global-norm clipping, in float64."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  for grads in grads_per_step:
    g = {k: np.asarray(v, np.float64) for k, v in grads.items()}
    norm = np.sqrt(sum((v ** 2).sum() for v in g.values()))
    g = {k: v * min(1.0, clip / norm) for k, v in g.items()}
    for k in p:
      u = np.sign(b1 * m[k] + (1 - b1) * g[k])
      decay = (u * p[k] >= 0) if cautious else np.ones_like(p[k])
      m[k] = b2 * m[k] + (1 - b2) * g[k]
      p[k] = p[k] - lr * (u + wd * decay * p[k])
  return p


@pytest.mark.parametrize("cautious", [False, True])
def test_lion_matches_a_hand_computation(cautious):
  # Step 2's direction mixes step 1's momentum with a gradient of the other sign: with
  # b1 = 0.9, b2 = 0.5, m₁ = 0.5·g₁ and c₂ = 0.45·g₁ + 0.1·g₂, so sign(c₂) ≠ sign(g₂) where
  # |g₂| < 4.5·|g₁|. ‖g‖ > 1 on step 1: clipping is in the chain.
  params = {"w": np.asarray([[0.5, -0.2], [0.1, -0.7]], np.float32),
            "b": np.asarray([0.3, -0.4], np.float32)}
  grads = [{"w": np.asarray([[1.0, -0.5], [0.2, 0.4]], np.float32),
            "b": np.asarray([-0.6, 0.8], np.float32)},
           {"w": np.asarray([[-2.0, 3.0], [-0.1, -5.0]], np.float32),
            "b": np.asarray([0.5, -0.3], np.float32)}]
  kw = dict(lr=0.1, b1=0.9, b2=0.5, wd=0.2)
  config = _config(name="lion", decay_steps=10**9, weight_decay=kw["wd"], b1=kw["b1"],
                   b2=kw["b2"], lr=kw["lr"], cautious_weight_decay=cautious)
  ours, _, _ = _trajectory(run_setup.build_optimizer(config, 10),
                           jax.tree.map(jnp.asarray, params),
                           [jax.tree.map(jnp.asarray, g) for g in grads])
  expected = _numpy_lion(params, grads, clip=1.0, cautious=cautious, **kw)
  for k in params:
    np.testing.assert_allclose(np.asarray(ours[k]), expected[k], atol=1e-6)
  if cautious:  # The data make the cautious mask bite somewhere.
    plain = _numpy_lion(params, grads, clip=1.0, **kw)
    assert not np.allclose(plain["w"], expected["w"])


def test_lion_equals_optax_lion_without_cautious_decay():
  config = _config(name="lion", lr=0.01, weight_decay=0.05, warmup_steps=2, b2=0.99)
  params, grads = _problem(jnp.float32)
  ours, _, _ = _trajectory(run_setup.build_optimizer(config, 10), params, grads)
  schedule = optimizers.schedule_fn(config.optimizer, 10)
  reference = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.lion(schedule, b1=0.9, b2=0.99, weight_decay=0.05))
  ref, _, _ = _trajectory(reference, params, grads)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, atol=1e-7)


def test_linear_schedule_warmup_then_decay_over_a_fraction():
  opt = base_configs.optimizer_config(lr=1.0, warmup_steps=2, schedule="linear",
                                      decay_fraction=0.8)
  schedule = optimizers.schedule_fn(opt, 10)
  # Warm-up 0 → 1 over 2 steps, then 1 → 0.1 linearly until step 8 = 0.8·10, then 0.1.
  expected = [0.0, 0.5, 1.0, 0.85, 0.7, 0.55, 0.4, 0.25, 0.1, 0.1, 0.1]
  np.testing.assert_allclose([float(schedule(t)) for t in range(11)], expected, atol=1e-6)
  with pytest.raises(ValueError, match=r"config\.optimizer\.schedule='step'"):
    optimizers.schedule_fn(base_configs.optimizer_config(lr=1.0, schedule="step"), 10)
  with pytest.raises(ValueError, match=r"config\.optimizer\.decay_fraction=0\.0"):
    optimizers.schedule_fn(base_configs.optimizer_config(lr=1.0, decay_fraction=0.0), 10)


def test_cosine_default_is_unchanged_by_the_decay_fraction_key():
  opt = base_configs.optimizer_config(lr=1.0, warmup_steps=2)
  reference = optax.warmup_cosine_decay_schedule(0.0, 1.0, 2, 6, 0.1)
  schedule = optimizers.schedule_fn(opt, 6)
  np.testing.assert_allclose([float(schedule(t)) for t in range(8)],
                             [float(reference(t)) for t in range(8)])


def test_muon_dimension_numbers_view_kernels_as_in_out_matrices():
  dims = optimizers.muon_dimension_numbers
  assert dims("lm/layers/0/attn/q_proj", (128, 4, 32)) == ((0,), (1, 2))
  assert dims("lm/layers/0/attn/o_proj", (4, 32, 128)) == ((0, 1), (2,))
  assert dims("lm/layers/0/mlp/up_proj", (128, 256)) == ((0,), (1,))
  assert dims("encoder/conv", (3, 3, 128, 128)) == ((0, 1, 2), (3,))
  # A scanned stack: the layer axis is a batch axis.
  assert dims("lm/layers/attn/q_proj", (3, 128, 4, 32)) == ((1,), (2, 3))
  assert dims("lm/layers/mlp/down_proj", (3, 256, 128)) == ((1,), (2,))
  assert dims("lm/layers/input_norm/scale", (3, 128)) is None
  assert dims("lm/final_norm/scale", (128,)) is None


def test_muon_orthogonalises_a_matrix_and_leaves_vectors_to_adamw():
  # First step, no clipping (‖g‖ < 1), lr 1: the matrix update is −√max(1, d_out/d_in)·O with
  # O ≈ the orthogonal polar factor U Vᵀ of the (Nesterov) momentum, which is ∝ g on step 1;
  # the vector goes to optax's AdamW fallback.
  rng = np.random.RandomState(0)
  g = rng.randn(8, 8).astype(np.float32) * 0.05
  grads = {"w": jnp.asarray(g), "b": jnp.asarray([0.1, -0.2, 0.0], jnp.float32)}
  params = jax.tree.map(jnp.zeros_like, grads)
  optimizer = run_setup.build_optimizer(_config(name="muon", lr=1.0, decay_steps=10**9), 10)
  update, _ = optimizer.update(grads, optimizer.init(params), params)
  u, _, vt = np.linalg.svd(g)
  w = -np.asarray(update["w"])
  # Five Newton–Schulz steps with Muon's coefficients give singular values in ≈ [0.7, 1.2], not
  # exactly 1 (and not in g's order): the update keeps g's singular vectors (Uᵀ W V diagonal)
  # with singular values near 1.
  core = u.T @ w @ vt.T
  np.testing.assert_allclose(core - np.diag(np.diag(core)), 0.0, atol=2e-3)
  assert np.diag(core).min() > 0.5 and np.diag(core).max() < 1.3, np.diag(core)
  # optax's fallback is Nesterov AdamW (muon's `nesterov=True`): step 1's first moment is
  # b1·m₁/(1 − b1²) + (1 − b1)·g/(1 − b1) = (1 + 0.09/0.19)·g with m₁ = 0.1·g, over √v̂ = |g|.
  nesterov = 1 + 0.9 * 0.1 / (1 - 0.9 ** 2)
  np.testing.assert_allclose(np.asarray(update["b"]), [-nesterov, nesterov, 0.0], rtol=1e-5)


@pytest.mark.parametrize("consistent_rms", [0.0, 0.2])
def test_muon_lion_matrix_step_is_optax_muons(consistent_rms):
  """The split's Muon branch (our `scale_by_muon_shape`) moves a hidden matrix exactly as
  `optax.contrib.muon` (name="muon") does, for a wide, a tall and a q_proj-shaped kernel."""
  rng = np.random.RandomState(1)
  grads = {"lm": {"layers": {"0": {
    "mlp": {"up_proj": jnp.asarray(rng.randn(8, 24) * 0.01, jnp.float32),
            "down_proj": jnp.asarray(rng.randn(24, 8) * 0.01, jnp.float32)},
    "attn": {"q_proj": jnp.asarray(rng.randn(8, 2, 4) * 0.01, jnp.float32)}}}}}
  params = jax.tree.map(jnp.zeros_like, grads)
  steps = {}
  for name in ("muon", "muon_lion"):
    optimizer = run_setup.build_optimizer(
      _config(name=name, lr=0.1, decay_steps=10**9, muon_consistent_rms=consistent_rms), 10)
    steps[name], _ = optimizer.update(grads, optimizer.init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8),
               steps["muon"], steps["muon_lion"])


def _detector_params():
  """The perception detector's parameters at runlocal size (shapes only)."""
  from flax import nnx

  from configs import perception_dense
  from jaxrl_post.models import get_model_config
  from jaxrl_post.models.perception import PerceptionConfig, PerceptionDetector
  from jaxrl_post.tasks import dense_scenes as ds
  c = perception_dense.get_config("runlocal,phase=rl,optimizer=paper")
  lm = get_model_config(c.model, vocab_size=ds.VOCAB_SIZE, **dict(c.model_overrides))
  pc = PerceptionConfig(lm, image_size=c.image_size, patch_size=c.patch_size,
                        coord_bins=c.coord_bins, size_bins=c.size_bins, coord_token=ds.COORD,
                        size_token=ds.SIZE, pointer_head=True, conv_stem=True)
  model = nnx.eval_shape(lambda: PerceptionDetector(pc, rngs=nnx.Rngs(0)))
  return c, nnx.state(model, nnx.Param)


def test_paper_split_of_the_perception_detector():
  """Muon: the hidden matrices; Lion: norms and embeddings; Lion at lr/√d: the heads."""
  config, params = _detector_params()
  labels = optimizers.muon_lion_labels(params, lion_params=config.optimizer.lion_params,
                                       head_params=config.optimizer.head_params)
  by_path = {phases.path_string(kp): label
             for kp, label in jax.tree_util.tree_leaves_with_path(labels)}
  heads = {"lm/lm_head", "coord_head", "size_head", "ptr_q", "ptr_k", "ptr_off"}
  embeddings = {"lm/embed", "x_embed", "y_embed", "w_embed", "h_embed", "encoder/row",
                "encoder/col"}
  norms = {p for p in by_path if p.endswith("norm/scale")}
  assert {p for p, lab in by_path.items() if lab == "head"} == heads
  assert {p for p, lab in by_path.items() if lab == "lion"} == embeddings | norms
  muon = {p for p, lab in by_path.items() if lab == "muon"}
  assert muon == set(by_path) - heads - embeddings - norms
  assert {"encoder/conv", "encoder/proj", "lm/layers/0/attn/q_proj",
          "lm/layers/0/mlp/down_proj"} <= muon
  assert config.optimizer.head_lr_scale == pytest.approx(64 ** -0.5)  # runlocal d = 64.


def test_paper_split_steps_at_the_stated_rates():
  """One step of the split on all-ones gradients: Lion moves each embedding entry by exactly
  lr (sign), each head entry by lr/√d; Muon moves the matrices by an orthogonalised step."""
  config, shapes = _detector_params()
  params = jax.tree.map(lambda s: jnp.full(s.shape, 0.0, s.dtype), shapes)
  grads = jax.tree.map(lambda p: jnp.ones_like(p) * 1e-4, params)  # ‖g‖ < 1: no clipping.
  config.optimizer.warmup_steps = 0
  optimizer = run_setup.build_optimizer(config, 4)
  updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)
  flat = {phases.path_string(kp): np.asarray(u)
          for kp, u in jax.tree_util.tree_leaves_with_path(updates)}
  lr = config.optimizer.lr
  np.testing.assert_allclose(flat["x_embed"], -lr, rtol=1e-5)
  np.testing.assert_allclose(flat["lm/final_norm/scale"], -lr, rtol=1e-5)
  np.testing.assert_allclose(flat["coord_head"], -lr * 64 ** -0.5, rtol=1e-5)
  # All-ones gradient = rank one: the orthogonalised update is ∝ the all-ones matrix too.
  up = flat["lm/layers/0/mlp/up_proj"]
  assert np.all(up < 0) and np.ptp(up) < 1e-3 * np.abs(up).max() + 1e-12


@pytest.mark.parametrize("name", ["adamw", "sgd", "lion", "muon", "muon_lion"])
def test_each_optimizer_trains_a_tiny_model(name):
  """Ten train steps of a tiny `CausalLM` on one batch lower its loss, for every optimizer."""
  from flax import nnx

  from jaxrl_post import tokenizers
  from jaxrl_post.training.checkpoint import StartPoint
  from jaxrl_post.training.train_state import create_train_state, make_train_step
  tokenizer = tokenizers.get_tokenizer("char")
  config = ml_collections.ConfigDict(dict(seed=0, tokenizer="char", model="tiny"))
  config.model_overrides = ml_collections.ConfigDict(dict(num_layers=1))
  base_configs.precision_config(config)
  lr = {"adamw": 1e-2, "sgd": 0.5, "lion": 1e-3, "muon": 2e-2, "muon_lion": 2e-3}[name]
  config.optimizer = base_configs.optimizer_config(lr=lr, name=name, decay_steps=10**9)
  model = run_setup.build_model(config, tokenizer, StartPoint("scratch"))
  optimizer = run_setup.build_optimizer(config, total_steps=10)
  state = create_train_state(model, optimizer, jax.random.key(0))

  def loss_fn(model, batch):
    logp = jax.nn.log_softmax(model(batch["tokens"])[:, :-1])
    nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], axis=-1)
    return nll.mean(), {}

  step_fn = make_train_step(nnx.split(model)[0], loss_fn, optimizer)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, tokenizer.vocab_size, (4, 12)),
                       jnp.int32)
  losses = []
  for _ in range(10):
    state, metrics = step_fn(state, {"tokens": tokens})
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.1, losses


def test_new_optimizer_errors_name_the_config_key():
  with pytest.raises(ValueError, match=r"config\.optimizer\.cautious_weight_decay.*'adamw'"):
    run_setup.build_optimizer(_config(lr=1e-3, cautious_weight_decay=True), 10)
  with pytest.raises(ValueError, match=r"config\.optimizer\.cautious_weight_decay"):
    run_setup.build_optimizer(_config(lr=1e-3, name="muon", cautious_weight_decay=True), 10)
  with pytest.raises(ValueError, match=r"config\.optimizer\.head_lr_scale=0"):
    run_setup.build_optimizer(_config(lr=1e-3, name="muon_lion", head_lr_scale=0), 10)
  with pytest.raises(ValueError, match=r"'adamw', 'sgd', 'lion', 'muon', 'muon_lion'"):
    run_setup.build_optimizer(_config(lr=1e-3, name="adafactor"), 10)
