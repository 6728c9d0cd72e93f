"""Advantage estimators: outcome advantages from scalar rewards, and step / token credit.

`outcome` holds the group-relative estimators over one scalar reward per rollout (GRPO,
batch-std, Dr.GRPO, RLOO), named in `ADVANTAGES`.
"""

from jaxrl_post.advantages.outcome import ADVANTAGES as ADVANTAGES
from jaxrl_post.advantages.outcome import STD_MODES as STD_MODES
from jaxrl_post.advantages.outcome import CombinedRewards as CombinedRewards
from jaxrl_post.advantages.outcome import batch_std_advantages as batch_std_advantages
from jaxrl_post.advantages.outcome import combine_rewards as combine_rewards
from jaxrl_post.advantages.outcome import contiguous_group_ids as contiguous_group_ids
from jaxrl_post.advantages.outcome import drgrpo_advantages as drgrpo_advantages
from jaxrl_post.advantages.outcome import group_advantages as group_advantages
from jaxrl_post.advantages.outcome import rloo_advantages as rloo_advantages
