"""Pure loss functions for RL post-training: policy objectives, aggregation, KL estimators, OPD.

Arrays in, `(loss, aux)` out; no models or configs. Variants are picked by name through
`POLICY_LOSSES`, `KL_ESTIMATORS`, `LOSS_AGG_MODES` and `OPD_REWARDS`; the on-policy
distillation family's advantages and transforms through `TV_OPD_ADVANTAGES`,
`JOINT_OPD_BASELINES` and `GATED_OPD_ADVANTAGES` (OPRD's gradient correction is
`oprd_transform`).
"""

from jaxrl_post.losses.aggregation import LOSS_AGG_MODES as LOSS_AGG_MODES
from jaxrl_post.losses.aggregation import Normalizers as Normalizers
from jaxrl_post.losses.aggregation import aggregate as aggregate
from jaxrl_post.losses.aggregation import loss_normalizers as loss_normalizers
from jaxrl_post.losses.aggregation import nll_loss as nll_loss
from jaxrl_post.losses.distillation import OPD_REWARDS as OPD_REWARDS
from jaxrl_post.losses.distillation import DomainMetrics as DomainMetrics
from jaxrl_post.losses.distillation import DomainStats as DomainStats
from jaxrl_post.losses.distillation import DomainWeighting as DomainWeighting
from jaxrl_post.losses.distillation import FullVocabOPDAux as FullVocabOPDAux
from jaxrl_post.losses.distillation import MOPDAux as MOPDAux
from jaxrl_post.losses.distillation import OPDTopKAux as OPDTopKAux
from jaxrl_post.losses.distillation import check_domain_ids as check_domain_ids
from jaxrl_post.losses.distillation import domain_metrics as domain_metrics
from jaxrl_post.losses.distillation import domain_token_stats as domain_token_stats
from jaxrl_post.losses.distillation import domain_weighting as domain_weighting
from jaxrl_post.losses.distillation import domain_weights as domain_weights
from jaxrl_post.losses.distillation import domain_weights_from_stats as domain_weights_from_stats
from jaxrl_post.losses.distillation import encode_domain_labels as encode_domain_labels
from jaxrl_post.losses.distillation import full_vocab_opd_loss as full_vocab_opd_loss
from jaxrl_post.losses.distillation import full_vocab_opd_reward as full_vocab_opd_reward
from jaxrl_post.losses.distillation import full_vocab_reverse_kl as full_vocab_reverse_kl
from jaxrl_post.losses.distillation import mopd_loss as mopd_loss
from jaxrl_post.losses.distillation import mopd_reward as mopd_reward
from jaxrl_post.losses.distillation import mopd_topk_reward as mopd_topk_reward
from jaxrl_post.losses.distillation import opd_topk_ppo_loss as opd_topk_ppo_loss
from jaxrl_post.losses.distillation import refresh_topk_reward as refresh_topk_reward
from jaxrl_post.losses.distillation import rollout_domain_weights as rollout_domain_weights
from jaxrl_post.losses.distillation import sampled_token_opd_reward as sampled_token_opd_reward
from jaxrl_post.losses.distillation import topk_opd_reward as topk_opd_reward
from jaxrl_post.losses.distillation import topk_staleness_kl as topk_staleness_kl
from jaxrl_post.losses.gated_opd import GATED_OPD_ADVANTAGES as GATED_OPD_ADVANTAGES
from jaxrl_post.losses.gated_opd import TeacherGate as TeacherGate
from jaxrl_post.losses.gated_opd import gated_opd_advantages as gated_opd_advantages
from jaxrl_post.losses.gated_opd import grpd_advantages as grpd_advantages
from jaxrl_post.losses.gated_opd import grpd_scale as grpd_scale
from jaxrl_post.losses.gated_opd import opdvr_advantages as opdvr_advantages
from jaxrl_post.losses.gated_opd import opdvr_gate as opdvr_gate
from jaxrl_post.losses.gated_opd import opdvr_inverse_advantages as opdvr_inverse_advantages
from jaxrl_post.losses.gated_opd import teacher_gate as teacher_gate
from jaxrl_post.losses.gated_opd import tgopd_advantages as tgopd_advantages
from jaxrl_post.losses.joint_opd import JOINT_OPD_BASELINES as JOINT_OPD_BASELINES
from jaxrl_post.losses.joint_opd import JointOPDTerms as JointOPDTerms
from jaxrl_post.losses.joint_opd import annealed_beta as annealed_beta
from jaxrl_post.losses.joint_opd import auto_switch_step as auto_switch_step
from jaxrl_post.losses.joint_opd import final_eos_mask as final_eos_mask
from jaxrl_post.losses.joint_opd import hdpo_advantages as hdpo_advantages
from jaxrl_post.losses.joint_opd import joint_opd_advantages as joint_opd_advantages
from jaxrl_post.losses.joint_opd import kdrl_advantages as kdrl_advantages
from jaxrl_post.losses.joint_opd import kdrl_annealing_advantages as kdrl_annealing_advantages
from jaxrl_post.losses.joint_opd import kdrl_mask_advantages as kdrl_mask_advantages
from jaxrl_post.losses.joint_opd import opd_then_rl_advantages as opd_then_rl_advantages
from jaxrl_post.losses.joint_opd import rlsd_advantages as rlsd_advantages
from jaxrl_post.losses.joint_opd import srpo_advantages as srpo_advantages
from jaxrl_post.losses.joint_opd import trrd_advantages as trrd_advantages
from jaxrl_post.losses.kl import KL_ESTIMATORS as KL_ESTIMATORS
from jaxrl_post.losses.kl import k1 as k1
from jaxrl_post.losses.kl import k2 as k2
from jaxrl_post.losses.kl import k3 as k3
from jaxrl_post.losses.kl import kl_estimate as kl_estimate
from jaxrl_post.losses.kl import kl_reward_penalty as kl_reward_penalty
from jaxrl_post.losses.oprd import OPRDLambda as OPRDLambda
from jaxrl_post.losses.oprd import oprd_direction as oprd_direction
from jaxrl_post.losses.oprd import oprd_lambda as oprd_lambda
from jaxrl_post.losses.oprd import oprd_support as oprd_support
from jaxrl_post.losses.oprd import oprd_support_from_logits as oprd_support_from_logits
from jaxrl_post.losses.oprd import oprd_transform as oprd_transform
from jaxrl_post.losses.policy import POLICY_LOSSES as POLICY_LOSSES
from jaxrl_post.losses.policy import PolicyLossAux as PolicyLossAux
from jaxrl_post.losses.policy import cispo_loss as cispo_loss
from jaxrl_post.losses.policy import gspo_loss as gspo_loss
from jaxrl_post.losses.policy import gspo_token_loss as gspo_token_loss
from jaxrl_post.losses.policy import policy_loss as policy_loss
from jaxrl_post.losses.policy import sampler_importance_weights as sampler_importance_weights
from jaxrl_post.losses.policy import sapo_loss as sapo_loss
from jaxrl_post.losses.tv_opd import TV_OPD_ADVANTAGES as TV_OPD_ADVANTAGES
from jaxrl_post.losses.tv_opd import TVOPDState as TVOPDState
from jaxrl_post.losses.tv_opd import TVStats as TVStats
from jaxrl_post.losses.tv_opd import group_constant_opd_advantages as group_constant_opd_advantages
from jaxrl_post.losses.tv_opd import init_tv_opd_state as init_tv_opd_state
from jaxrl_post.losses.tv_opd import permuted_opd_advantages as permuted_opd_advantages
from jaxrl_post.losses.tv_opd import raw_opd_advantages as raw_opd_advantages
from jaxrl_post.losses.tv_opd import sign_opd_advantages as sign_opd_advantages
from jaxrl_post.losses.tv_opd import tv_estimate as tv_estimate
from jaxrl_post.losses.tv_opd import tv_opd_advance as tv_opd_advance
from jaxrl_post.losses.tv_opd import tv_opd_advantages as tv_opd_advantages
from jaxrl_post.losses.tv_opd import tv_opd_commit as tv_opd_commit
