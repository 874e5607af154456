"""Token-level divergences between teacher and draft next-token distributions (DistillSpec's menu).

Each takes logits ``[N, V]`` and returns a per-token loss ``[N]``. Total variation distance is exactly one
minus the expected acceptance of speculative sampling, so it optimises acceptance directly; forward KL and
JSD give smoother gradients. Which wins is measured, not assumed (``divergence='auto'``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from distill.config import Divergence


def forward_kl(teacher_logits: torch.Tensor, draft_logits: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    teacher_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    draft_logp = F.log_softmax(draft_logits.float(), dim=-1)
    return (teacher_logp.exp() * (teacher_logp - draft_logp)).sum(-1)


def reverse_kl(teacher_logits: torch.Tensor, draft_logits: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    teacher_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    draft_logp = F.log_softmax(draft_logits.float(), dim=-1)
    return (draft_logp.exp() * (draft_logp - teacher_logp)).sum(-1)


def generalised_jsd(
    teacher_logits: torch.Tensor, draft_logits: torch.Tensor, beta: float = 0.5
) -> torch.Tensor:
    """``beta * KL(p || m) + (1 - beta) * KL(q || m)`` with ``m = beta * p + (1 - beta) * q``."""
    teacher_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    draft_logp = F.log_softmax(draft_logits.float(), dim=-1)
    mixture_logp = torch.logsumexp(
        torch.stack(
            [teacher_logp + torch.log(torch.tensor(beta)), draft_logp + torch.log(torch.tensor(1 - beta))]
        ),
        dim=0,
    )
    kl_teacher = (teacher_logp.exp() * (teacher_logp - mixture_logp)).sum(-1)
    kl_draft = (draft_logp.exp() * (draft_logp - mixture_logp)).sum(-1)
    return beta * kl_teacher + (1 - beta) * kl_draft


def total_variation(
    teacher_logits: torch.Tensor, draft_logits: torch.Tensor, beta: float = 0.5
) -> torch.Tensor:
    teacher_p = F.softmax(teacher_logits.float(), dim=-1)
    draft_p = F.softmax(draft_logits.float(), dim=-1)
    return 0.5 * (teacher_p - draft_p).abs().sum(-1)


DIVERGENCES: dict[Divergence, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "fkl": forward_kl,
    "rkl": reverse_kl,
    "jsd": generalised_jsd,
    "tvd": total_variation,
}


def expected_acceptance(teacher_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Per-token acceptance probability of speculative sampling: ``sum_v min(p_v, q_v)``."""
    return torch.minimum(F.softmax(teacher_logits.float(), -1), F.softmax(draft_logits.float(), -1)).sum(-1)
