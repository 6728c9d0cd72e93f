"""Pure loss functions for RL post-training: policy objectives, aggregation, KL estimators.

Arrays in, `(loss, aux)` out; no models or configs. Variants are picked by name through
`POLICY_LOSSES`, `KL_ESTIMATORS` and `LOSS_AGG_MODES`.
"""

from jaxrl_post.losses.aggregation import LOSS_AGG_MODES as LOSS_AGG_MODES
from jaxrl_post.losses.aggregation import Normalizers as Normalizers
from jaxrl_post.losses.aggregation import aggregate as aggregate
from jaxrl_post.losses.aggregation import loss_normalizers as loss_normalizers
from jaxrl_post.losses.kl import KL_ESTIMATORS as KL_ESTIMATORS
from jaxrl_post.losses.kl import k1 as k1
from jaxrl_post.losses.kl import k2 as k2
from jaxrl_post.losses.kl import k3 as k3
from jaxrl_post.losses.kl import kl_estimate as kl_estimate
from jaxrl_post.losses.kl import kl_reward_penalty as kl_reward_penalty
from jaxrl_post.losses.policy import POLICY_LOSSES as POLICY_LOSSES
from jaxrl_post.losses.policy import PolicyLossAux as PolicyLossAux
from jaxrl_post.losses.policy import cispo_loss as cispo_loss
from jaxrl_post.losses.policy import gspo_loss as gspo_loss
from jaxrl_post.losses.policy import gspo_token_loss as gspo_token_loss
from jaxrl_post.losses.policy import policy_loss as policy_loss
from jaxrl_post.losses.policy import sampler_importance_weights as sampler_importance_weights
from jaxrl_post.losses.policy import sapo_loss as sapo_loss
