"""configs/crystal_grpo.py + methods/crystal_grpo.py in runlocal mode: pretraining, GRPO in
mode c from it, a stopped-and-resumed run repeating the uninterrupted one, config errors."""

from pathlib import Path

import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.crystal_grpo import CrystalGRPO
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "crystal_grpo.py")


def _train(workdir, arg, **overrides):
  config = CONFIG.get_config(arg)
  config.update(overrides)
  loop.train(config, workdir, CrystalGRPO(config))
  return read_metrics(workdir)


def test_pretrain_then_grpo_resumes_exactly(tmp_path):
  pre = _train(tmp_path / "pre", "runlocal,method=pretrain")
  assert [r["step"] for r in pre if "train/loss" in r] == [1, 2, 3]
  start = str(tmp_path / "pre")
  arg = "runlocal,method=grpo,mode=c"
  straight = _train(tmp_path / "straight", arg, init_from=start)
  _train(tmp_path / "resumed", arg, init_from=start, steps=1)
  resumed = _train(tmp_path / "resumed", arg, init_from=start)
  keys = ("train/loss", "train/reward", "train/grad_norm", "train/kl_sum", "train/adv_abs")
  a = [r for r in straight if "train/reward" in r]
  b = [r for r in resumed if "train/reward" in r]
  assert [r["step"] for r in a] == [1, 2]
  for x, y in zip(a, b, strict=True):
    for key in keys:
      assert x[key] == y[key], (x["step"], key)
  evals = [r for r in resumed if "eval/mr1" in r]
  assert evals[0]["eval/kl_pretrained"] < 1e-9  # step 0: the policy is the pretrained one
  assert evals[-1]["eval/kl_pretrained"] > 0 and a[-1]["train/kl_sum"] > 0
  assert evals[-1]["step"] == 2 and 0 <= evals[-1]["eval/mr1"] <= evals[-1]["eval/mr_top"] <= 1
  # Mode q with a window KL (β > 0): one step; the window KL is 0 at the reference.
  config = CONFIG.get_config("runlocal,method=grpo,mode=q")
  config.update(init_from=start, steps=1)
  config.crystal.beta = 0.01
  loop.train(config, tmp_path / "q", CrystalGRPO(config))
  (q,) = [r for r in read_metrics(tmp_path / "q") if "train/reward" in r]
  assert q["train/kl"] == 0.0 and q["train/grad_norm"] > 0


def test_config_variants_and_errors():
  config = CONFIG.get_config("")
  assert (config.method, config.steps, config.crystal.mode, config.task.target) == (
    "pretrain", 3000, "q", 1)
  c = CONFIG.get_config("method=grpo,mode=c")
  assert (c.crystal.mode, c.crystal.eta, c.crystal.beta_full, c.crystal.dedup) == (
    "c", 1.0, 0.01, True)
  e = CONFIG.get_config("method=grpo,mode=energy")
  assert (e.crystal.mode, e.task.w_match, e.task.w_energy) == ("q", 0.0, 1.0)
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert [kw["seed"] for kw in added] == [0, 1, 2]
  with pytest.raises(ValueError, match="unknown mode 'x'"):
    CONFIG.get_config("mode=x")
  with pytest.raises(ValueError, match="config.init_from: method 'grpo' starts from"):
    CrystalGRPO(CONFIG.get_config("runlocal,method=grpo"))
  bad = CONFIG.get_config("runlocal")
  bad.crystal.eta = 0.5
  with pytest.raises(ValueError, match=r"config.crystal.eta=0.5 applies in mode 'c' only"):
    CrystalGRPO(bad)
  bad = CONFIG.get_config("runlocal")
  bad.task.target = 3
  with pytest.raises(ValueError, match=r"config.task: target=3 must be a polymorph index"):
    CrystalGRPO(bad)
  bad = CONFIG.get_config("runlocal,mode=c")
  bad.crystal.coverage = "volume"
  with pytest.raises(KeyError, match="unknown coverage 'volume'"):
    CrystalGRPO(bad)
  bad = CONFIG.get_config("runlocal")
  bad.crystal.a_lattice = 0.0
  with pytest.raises(ValueError, match=r"config.crystal.a_lattice=0.0 must be > 0"):
    CrystalGRPO(bad)


def test_kl_is_summed_over_all_denoising_steps():
  """C mode's regulariser: Σ_{t<T} ‖μ_θ − μ_ref‖²/(2 s_t²) on the rollout's states, every step
  (not only the window), the F block's difference taken as a minimum image."""
  import functools

  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from jaxrl_post.methods import crystal_grpo as cg
  from jaxrl_post.sampling import flow_sde
  from jaxrl_post.tasks import toy_crystals as tc

  task = tc.CrystalTask()
  model = cg.CrystalVelocity(task.num_atoms, hidden=8, depth=1, time_dim=4, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  reference = jax.tree.map(lambda p: p + 0.05, params)
  apply = functools.partial(cg._apply, graphdef)
  steps, n = 4, 3
  grid = jnp.asarray(flow_sde.time_grid(steps))
  a = jnp.asarray(tc.noise_levels(task, 0.1, 0.5))
  wrap = tc.crystal_wrap(task)
  traj = flow_sde.sample_trajectory(lambda x, t: apply(params, x, t),
                                    jax.random.normal(jax.random.key(0), (n, task.dim)), grid,
                                    a, key=jax.random.key(1), reduction="sum", wrap=wrap)
  hp = cg.CrystalSettings(reduction="sum")
  logp, kl = cg.policy_steps(apply, params, reference, traj, tuple(range(steps)), grid, a,
                             wrap, hp)
  np.testing.assert_allclose(logp, traj.logp, rtol=1e-5, atol=1e-4)  # on-policy: ρ = 1
  want = np.zeros((steps, n))
  for k in range(steps):
    t = jnp.full((n,), grid[k])
    mean, std = flow_sde.sde_mean_std(apply(params, traj.x[k], t), grid[k], grid[k + 1],
                                      traj.x[k], a, t_cap=grid[1])
    ref, _ = flow_sde.sde_mean_std(apply(reference, traj.x[k], t), grid[k], grid[k + 1],
                                   traj.x[k], a, t_cap=grid[1])
    d = np.array(mean - ref)
    d[:, :8] -= np.round(d[:, :8])
    want[k] = np.sum(d ** 2 / (2 * np.asarray(jnp.broadcast_to(std, d.shape)) ** 2), axis=1)
  np.testing.assert_allclose(kl, want, rtol=1e-4)
  assert np.all(want > 0)


@pytest.mark.parametrize("mode", ["q", "c"])
def test_lean_schedules_give_the_native_gradient(mode):
  """retain / reweight (training.lean_grpo with the crystal's wrap and coverage advantages as
  hooks) give the native schedule's gradient, loss and advantages on the same noise."""
  import dataclasses

  import jax
  import numpy as np
  from flax import nnx

  from jaxrl_post.methods import crystal_grpo as cg
  from jaxrl_post.sampling import flow_sde
  from jaxrl_post.tasks import toy_crystals as tc

  task = tc.CrystalTask()
  model = cg.CrystalVelocity(task.num_atoms, hidden=16, depth=2, time_dim=4, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  reference = jax.tree.map(lambda p: 1.05 * p, params)
  steps, groups, members = 4, 2, 4
  x_init = jax.random.normal(jax.random.key(0), (groups * members, task.dim))
  noise = jax.random.normal(jax.random.key(1), (steps, groups * members, task.dim))
  grid = jax.numpy.asarray(flow_sde.time_grid(steps))
  hp = cg.CrystalSettings(mode=mode, group_size=members, beta=0.02 if mode == "q" else 0.0,
                          eta=1.0 if mode == "c" else 0.0, dedup=mode == "c", selected=(0, 1))
  outs = {}
  for schedule in ("native", "retain", "reweight"):
    outs[schedule] = jax.jit(lambda p, h=dataclasses.replace(hp, schedule=schedule):
                             cg.crystal_gradient(p, reference, x_init, noise, grid,
                                                 graphdef=graphdef, task=task, hp=h))(params)
  flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])  # noqa: E731
  want = outs["native"]
  assert np.linalg.norm(flat(want.grads)) > 1e-4
  for schedule in ("retain", "reweight"):
    got = outs[schedule]
    np.testing.assert_allclose(flat(got.grads), flat(want.grads), rtol=1e-4,
                               atol=1e-4 * np.abs(flat(want.grads)).max())
    np.testing.assert_allclose(got.adv, want.adv, atol=1e-5)
    np.testing.assert_allclose(got.loss, want.loss, atol=1e-5)
    np.testing.assert_allclose(got.kl, want.kl, rtol=1e-4, atol=1e-9)


def test_lean_schedule_errors():
  bad = CONFIG.get_config("runlocal")
  bad.crystal.schedule = "lazy"
  with pytest.raises(ValueError, match=r"config.crystal.schedule='lazy'; valid: native"):
    CrystalGRPO(bad)
  bad = CONFIG.get_config("runlocal,mode=c")
  bad.crystal.schedule = "retain"
  with pytest.raises(ValueError, match=r"config.crystal.beta_full=0.01: the full-path KL"):
    CrystalGRPO(bad)
