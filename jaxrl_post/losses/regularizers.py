"""Regularisers of the RL family, named in one registry.

A regulariser is a term added to the policy loss that is not the per-token policy-gradient
surrogate itself: CoKL's correctness-conditioned KL to replayed reference answers
(arXiv 2608.01743) and CD-RFT's shared-control-bottleneck penalty (arXiv 2608.08224). Their
inputs differ (sequence log-probs of cached answers; per-family gradients and the parameter
displacement), so each entry is called with the keyword inputs its docstring lists and returns
`(loss, aux)`.
"""

from __future__ import annotations

from jaxrl_post.registry import Registry

REGULARIZERS: Registry = Registry("regularizer")
