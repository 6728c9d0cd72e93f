"""Inner RL for reward evolution: PPO in pure JAX on gymnax classic-control and brax tasks.

Submodules (import them directly):

* `task`: `ControlTask`, a gymnax environment plus the feature dict that reward modules read
  and the task/environment text the proposer sees.
* `envs`: `make_task(name)` for CartPole-v1, Pendulum-v1 and brax/<env> (the latter from
  `brax_envs`).
* `brax_envs`: brax hopper / halfcheetah / ant / reacher / pusher behind the gymnax interface
  (auto-reset, truncation, features of the terminal brax state); brax itself is imported only
  when a brax task is built.
* `ppo`: `make_train(config, task, ...)`, a purejaxrl-shaped, jittable, seed-`vmap`-able PPO that
  learns from a shaped reward and reports the task's true fitness separately.
* `adapter`: `make_train_fn`, the `train_fn(RewardCandidate) -> TrainResult` that
  `rewards.evolution.evolve` drives; `feature_statistics` / `loop_task_info`, the features'
  typical scales for the proposer; plus the baseline proposers (monolithic, no-pool).
"""
