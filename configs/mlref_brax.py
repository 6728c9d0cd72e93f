r"""MLREF (arXiv 2608.18827) reward evolution with PPO on brax tasks (CPU-sized).

The gymnax config (configs/mlref_gymnax.py) with brax environments, bigger PPO batches and
shorter episodes than brax's usual 1000 steps. Everything else (methods, credit, evolution,
proposers, variants) is that config's.

Commands (2 CPU cores):

  # Smoke test (reacher, 50-step episodes, MLREF only, 2 iterations, ~1 min):
  python experiments/mlref.py --config=configs/mlref_brax.py:runlocal --workdir=/tmp/mlref_brax

  # One method on one env, offline proposer:
  python experiments/mlref.py '--config=configs/mlref_brax.py:env=hopper,methods=mlref;env_reward' \
      --workdir=/tmp/mlref_hopper

  # All methods, 3 pipelines (the reproduction), e.g. halfcheetah:
  python experiments/mlref.py --config=configs/mlref_brax.py:env=halfcheetah \
      --workdir=/tmp/mlref_halfcheetah

Variants: those of mlref_gymnax plus `env=hopper|halfcheetah|ant|reacher|pusher` (default
reacher), `episode_length=<n>` (default: 50 for reacher / pusher, 200 for locomotion),
`backend=positional|generalized|spring|mjx`, `timesteps=<n>` (PPO steps per seed).

Expected: runlocal writes 2 fitness.jsonl lines with best_so_far ~ -60 (the reacher's
50-step return of a near-random policy: 4 PPO updates teach it nothing); it takes ~1 min on 2
cores, all XLA compiles (tests/rl_control/test_mlref_runlocal.py: 55-70 s).

CPU budget, measured on 2 cores shared with another job (nice 15), PPO compile + env steps/s
of one seed with 16 envs x 64 steps (a stand-in for this config's 32 x 64):

  env           compile   env steps/s       env           compile   env steps/s
  reacher       37 s      ~17k              halfcheetah   55 s      ~2.5k
  hopper        53 s      ~10k              ant           41 s      ~2.4k
  pusher        (PPO not measured) ~0.4k for a raw random-action rollout of 8 envs (31 s
                compile); 50 physics substeps per env step

Every candidate reward is a new XLA program (one compile per inner run). With the defaults
(204,800 steps x 2 seeds, 4 iterations x 3 variants = 12 inner runs per pipeline and method) one
inner run costs ~1 min of compile + 410k / rate: ~1.5 min on reacher, ~1.7 min on hopper,
~4 min on halfcheetah / ant, ~18 min on pusher. One pipeline of mlref is 12 of those (reacher
~17 min, halfcheetah / ant ~45 min); all 5 methods x 3 pipelines are ~147 inner runs (reacher
~3.5 h, hopper ~4 h, halfcheetah / ant ~10 h, pusher ~2 days). A CPU reproduction is therefore
one env and a subset of methods (`methods=mlref;env_reward`) or fewer `timesteps`; 200k steps
is also far too few for halfcheetah / ant to learn much, so expect MLREF-vs-env-reward
differences on reacher / hopper first. These rates are short-run measurements (+-50%). NOT yet
measured: this exact config (32 x 64, 8 minibatches, 2 seeds vmapped, full -O XLA) on reacher
did not finish compile + 20k steps within 7 min on the shared cores; check it (or set
`--config.fast_compile=True`) before planning a long run.
On a GPU (brax's intended setting: thousands of envs) the same runs are ~100x faster.
The rates above predate the running obs / reward normalisation (now on; a few elementwise
ops per step, expected negligible); `scripts/bench_brax.py` re-measures compile time and
steps/s with this config's PPO settings.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg

# Not an LLM-training config (no task / tokenizer / model): tests that check those should skip it.
CONFIG_KIND = "rl_control"
ENVS = ("hopper", "halfcheetah", "ant", "reacher", "pusher")


_BASE = load_module(Path(__file__).resolve().with_name("mlref_gymnax.py"), "_mlref_gymnax")


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="reacher", episode_length=0, backend="positional",
                  timesteps=204_800, proposer="offline", iterations=4, pipelines=3,
                  methods=_BASE.ALL_METHODS.replace(",", ";"))
  if arg.env not in ENVS:
    raise ValueError(f"unknown brax env {arg.env!r}; valid: {', '.join(ENVS)}")
  base_arg = f"runlocal={arg.runlocal},proposer={arg.proposer},iterations={arg.iterations}," \
             f"pipelines={arg.pipelines},methods={arg.methods}"
  c = _BASE.get_config(base_arg)
  episode_length = arg.episode_length or (50 if arg.env in ("reacher", "pusher") else 200)
  c.env = f"brax/{arg.env}?episode_length={episode_length}&backend={arg.backend}"
  # purejaxrl's brax PPO normalises both (every variant, runlocal included): brax observations
  # mix positions (~1 m) and joint velocities (~10 rad/s), and per-step rewards of O(1) give
  # returns of O(100) for the critic; without rescaling, locomotion hardly learns. Only what PPO
  # learns from is normalised: reward features and the fitness (brax's own return) stay raw.
  # Not in the gymnax config, whose CartPole / Pendulum results predate it and learn without.
  c.ppo.normalize_obs = True
  c.ppo.normalize_reward = True
  if arg.runlocal:
    # The gymnax runlocal PPO sizes (4 updates of 4 envs x 32 steps): episodes of 50 steps end
    # from the second update on; the whole run is dominated by two XLA compiles.
    return c
  # purejaxrl's brax PPO settings (lr 3e-4, no entropy bonus), at a CPU-sized batch:
  # 32 envs x 64 steps = 2048 transitions per update, U = timesteps / 2048 updates.
  c.ppo.update(num_envs=32, num_steps=64, total_timesteps=arg.timesteps, num_minibatches=8,
               lr=3e-4, ent_coef=0.0)
  c.score_window = 10
  return c


def sweep(add, arg=None):
  _BASE.sweep(add, arg)


def metrics():
  return _BASE.metrics()
