"""One room per method: what each method's step, evaluation and report do on the one loop.

A method is a plain object with the hooks of `jaxrl_post.training.loop.Method`; its binary in
`experiments/` is a docstring with the commands and `loop.train(config, workdir, Method(config))`.
The maths it uses lives in `jaxrl_post.losses`, `jaxrl_post.advantages` and
`jaxrl_post.rewards`; rollouts in `jaxrl_post.sampling`.

  grpo        GRPO-family RL on a verifiable task (any registered policy loss / advantage)
  sft         teacher-forced SFT on a task's demonstrations
  opd         multi-teacher on-policy distillation (Open-MOPD, arXiv 2608.19098)
  opd_family  the on-policy distillation family on one loop, by `config.distill.method`:
              OPD, TV-OPD (2609.08341), OPD-then-RL + its joint baselines (2609.04108),
              TGOPD (2609.02998), OPDVR / GRPD (2608.24696), OPRD (2609.08798), GRPO
  reflect_rl  ReflectRL (arXiv 2608.03972): groups mixing reflective prompts (a golden negative
              trajectory to correct) and direct ones; its OPD variant (Eq. 11)
  ice         ICE (arXiv 2608.02087): RL on instruction-conditioned rollouts plus the filtered
              forward KL from the conditioned policy to the bare-prompt one (same weights)
  rtpo        multi-turn agentic RL: RTPO (arXiv 2608.18682), turn-level and flattened GRPO,
              and OCSD (arXiv 2608.04788) as the `ocsd` mode: turn-level GRPO whose advantage is
              modulated per token by a dual-view observation calibration (`methods.ocsd`)
  perception  dense detection SFT + set-reward GRPO (Falcon Perception-HD, arXiv 2608.18881)
  pcqa        point-cloud quality assessment (PCQA-R1, arXiv 2608.18627)
  flow_grpo   a flow-matching policy: pretrain, then Flow-GRPO (arXiv 2505.05470) with
              LeanGRPO's recompute-free gradient schedules (2609.03528)
  gtn_r       a Gaussian-mixture forecaster: NLL pretraining, then TS-GRPO with GTN-R's
              ground-truth-neighbourhood regulariser or anchored groups (2608.08010);
              comparison and plot: scripts/gtn_r_collapse.py
  progressive_recsys  LP -> FFT -> RFT for a recommender foundation model (2608.06792):
              phases with freeze masks and per-group learning rates, an ordinal IPS reward model
  recoverfly  RecoverFly (arXiv 2608.09467): GRPO on grammar-constrained action tokens with
              failure replay and a two-stage long-tail curriculum (`failure_replay.py`) and a
              windowed reference KL (`losses.window_kl`)
  crystal_grpo  flow GRPO on toy 2-D crystals (CrystalGRPO, arXiv 2608.06582): a joint
              coordinate-lattice SDE on the torus; mode q (target reward on a window) or c
              (KL over all steps + coverage-aware group advantages)
GRPO's optional parts for the domain papers: `fault_injection.py` (MoE proxy fault injectors,
2608.10823), rollout admission in `group_source.py` (MISA-T, 2608.11152), and legal-token
decoding through `grpo.task_grammar` (PertMind, 2608.16419).
"""
