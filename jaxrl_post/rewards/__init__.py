"""Rewards: verifiers, matching and ranking rewards, and reward-module pools (MLREF).

Submodules (import them directly; this file stays import-light so that the sandbox child and
light tools do not pay for JAX):

* `module_pool`: module specs, the persistent pool, the composed reward R = Σ w_k m_k, hybrid
  credit (arXiv 2608.18827), merge with rollback.
* `credit`: the pure credit / selection maths (re-exported by `module_pool`).
* `overlong`: DAPO's overlong reward shaping (arXiv 2503.14476), the "overlong" column of
  `config.reward_weights`.
* `module_code`: the AST allow-list for proposed module code.
* `sandbox`: the separate-process test-run of proposed code.
* `llm_client`, `prompts`, `proposers`: the LLM (OpenAI-compatible) and offline proposers.
* `evolution`: the MLREF outer loop (Algorithm 1) around a caller-supplied RL trainer.
* `set_matching`: box IoU, Hungarian / greedy matching, set-level count / F1 / PQ rewards and
  dense-detection metrics (Falcon Perception-HD, arXiv 2608.18881).
* `ranking`: Thurstone fidelity ranking, Gaussian proximity and format rewards (PCQA-R1,
  arXiv 2608.18627); `quality_metrics`: SRCC / KRCC / PLCC after the 4-parameter logistic, RMSE.
* `rubrics`: rubric verdicts as arrays — DRACO's discriminative dropout, reward and step
  citation counts (arXiv 2609.04094), CARE's weighted pass score and evolution decision
  (arXiv 2609.00892) — named in `RUBRIC_REWARDS`.
"""
