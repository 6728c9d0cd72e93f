"""Advantage estimators: outcome advantages from scalar rewards, and step / token credit.

* `outcome`: the group-relative estimators over one scalar reward per rollout (GRPO,
  batch-std, Dr.GRPO, RLOO), named in `ADVANTAGES`.
* `reinforce_pp`: REINFORCE++ and REINFORCE++-baseline (arXiv 2501.03262), whitened over the
  batch, also in `ADVANTAGES` ("reinforce_pp", "reinforce_pp_baseline").
* `step_credit`: one advantage per step of a multi-turn rollout, `[B, G, S]`, named in
  `STEP_CREDIT` — `draco` (rubric citations, arXiv 2609.04094), `temporal_grpo` (stage-aligned,
  arXiv 2608.13026), `factor` (TD action credit, arXiv 2608.07118) — and `steps_to_tokens`.
* `gae`: per-token GAE advantages and λ-returns against a learned critic (PPO, arXiv
  1506.02438), outcome rewards placed on the last token, and batch whitening.
* `wmrl`: world-model rewards made usable (arXiv 2608.12564): an isotonic calibrator on anchor
  pairs (`REWARD_CALIBRATORS`), inverse-variance anchor weights, and their advantages.
* `coverage`: coverage-aware group advantages for a group's Top-N candidates (CrystalGRPO, arXiv
  2608.06582): leave-one-out marginal coverage (`COVERAGES`) and duplicate down-weighting.
"""

from jaxrl_post.advantages.coverage import COVERAGES as COVERAGES
from jaxrl_post.advantages.coverage import cluster_sizes as cluster_sizes
from jaxrl_post.advantages.coverage import coverage_advantages as coverage_advantages
from jaxrl_post.advantages.coverage import loo_basin_coverage as loo_basin_coverage
from jaxrl_post.advantages.coverage import loo_max_coverage as loo_max_coverage
from jaxrl_post.advantages.coverage import marginal_coverage as marginal_coverage
from jaxrl_post.advantages.draco import DracoStepStats as DracoStepStats
from jaxrl_post.advantages.draco import draco_step_advantages as draco_step_advantages
from jaxrl_post.advantages.draco import draco_step_stats as draco_step_stats
from jaxrl_post.advantages.draco import step_token_counts as step_token_counts
from jaxrl_post.advantages.factor import GroupReturnStats as GroupReturnStats
from jaxrl_post.advantages.factor import factor_td_credit as factor_td_credit
from jaxrl_post.advantages.factor import group_return_stats as group_return_stats
from jaxrl_post.advantages.factor import interpolated_values as interpolated_values
from jaxrl_post.advantages.gae import GAEOutput as GAEOutput
from jaxrl_post.advantages.gae import gae_advantages as gae_advantages
from jaxrl_post.advantages.gae import last_token_mask as last_token_mask
from jaxrl_post.advantages.gae import outcome_token_rewards as outcome_token_rewards
from jaxrl_post.advantages.gae import whiten as whiten
from jaxrl_post.advantages.outcome import ADVANTAGES as ADVANTAGES
from jaxrl_post.advantages.outcome import STD_MODES as STD_MODES
from jaxrl_post.advantages.outcome import CombinedRewards as CombinedRewards
from jaxrl_post.advantages.outcome import batch_std_advantages as batch_std_advantages
from jaxrl_post.advantages.outcome import combine_rewards as combine_rewards
from jaxrl_post.advantages.outcome import contiguous_group_ids as contiguous_group_ids
from jaxrl_post.advantages.outcome import drgrpo_advantages as drgrpo_advantages
from jaxrl_post.advantages.outcome import group_advantages as group_advantages
from jaxrl_post.advantages.outcome import rloo_advantages as rloo_advantages
from jaxrl_post.advantages.reinforce_pp import (
  reinforce_pp_advantages as reinforce_pp_advantages,
)
from jaxrl_post.advantages.reinforce_pp import (
  reinforce_pp_baseline_advantages as reinforce_pp_baseline_advantages,
)
from jaxrl_post.advantages.step_credit import STEP_CREDIT as STEP_CREDIT
from jaxrl_post.advantages.step_credit import steps_to_tokens as steps_to_tokens
from jaxrl_post.advantages.temporal_grpo import TemporalGRPOAdvantages as TemporalGRPOAdvantages
from jaxrl_post.advantages.temporal_grpo import check_stage_times as check_stage_times
from jaxrl_post.advantages.temporal_grpo import stage_success_delta as stage_success_delta
from jaxrl_post.advantages.temporal_grpo import temporal_grpo_advantages as temporal_grpo_advantages
from jaxrl_post.advantages.temporal_grpo import temporal_grpo_stages as temporal_grpo_stages
from jaxrl_post.advantages.wmrl import DEGENERATE_VAR as DEGENERATE_VAR
from jaxrl_post.advantages.wmrl import MIN_EMA_FOR_C as MIN_EMA_FOR_C
from jaxrl_post.advantages.wmrl import REWARD_CALIBRATORS as REWARD_CALIBRATORS
from jaxrl_post.advantages.wmrl import Breakpoints as Breakpoints
from jaxrl_post.advantages.wmrl import CalibratorState as CalibratorState
from jaxrl_post.advantages.wmrl import IVDState as IVDState
from jaxrl_post.advantages.wmrl import WMRLMetrics as WMRLMetrics
from jaxrl_post.advantages.wmrl import WMRLStep as WMRLStep
from jaxrl_post.advantages.wmrl import apply_calibration as apply_calibration
from jaxrl_post.advantages.wmrl import calibrator_init as calibrator_init
from jaxrl_post.advantages.wmrl import calibrator_update as calibrator_update
from jaxrl_post.advantages.wmrl import group_disagreement as group_disagreement
from jaxrl_post.advantages.wmrl import identity_calibration as identity_calibration
from jaxrl_post.advantages.wmrl import ivd_init as ivd_init
from jaxrl_post.advantages.wmrl import ivd_update as ivd_update
from jaxrl_post.advantages.wmrl import ivd_weight as ivd_weight
from jaxrl_post.advantages.wmrl import pav_fit as pav_fit
from jaxrl_post.advantages.wmrl import wmrl_advantages as wmrl_advantages
from jaxrl_post.advantages.wmrl import wmrl_step as wmrl_step
