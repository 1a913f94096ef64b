"""KTAE: key-token advantage estimation (Sun et al. 2025, arXiv 2505.16826; code: xiaolizh1/KTAE), a plug-in.

No model call. Within each group of rollouts of one prompt, every token id v gets a score from the 2×2 table of how
many correct and wrong rollouts contain it (a, b of n_c, n_w): association = (α·F + β·IG)/(α + β), with F = exp(−2p)
(p: two-sided Fisher exact test; F = 0 when p = 1, to 1e-9) and IG the information gain of "contains v" about
correctness (bits); direction x = asin√(a/n_c) − asin√(b/n_w), plus (option ktae_tf) a BM25-style term comparing v's
frequency in correct and wrong rollouts; kt(v) = top · (2σ(association · x) − 1) ∈ (−top, top). Every position
holding v gets kt(v), and the token advantage is Â = A + kt, which grail hands TRL as w = 1 + kt / A.

The choices the paper leaves open, and what this implementation does, are `OPEN_CHOICES` (on docs/methods/table.md).
Neither the row's mass nor the sign of A is preserved (|kt| can exceed |A|), as in the paper.
"""

from __future__ import annotations

import math

import torch

from grail.methods.spec import MethodOption, MethodSpec, TokenWeights

__all__ = ["OPEN_CHOICES", "SPEC", "key_token_scores"]

OPEN_CHOICES = (
    "Correct / wrong is the sign of A (reward > 0 for 0/1 rewards in a mixed group, the release's rule); rows with "
    "A = 0 are in no table and keep Â = 0.",
    "A group is the rows with the same prompt ids; with several processes, the rollouts of the group on this process.",
    "α = β = 1 with the frequency term on: the released code's effective values (its run scripts pass β = 2, which "
    "the code ignores).",
    "The tokenizer's special tokens get kt = 0 (the release zeroes Qwen's end-of-text only).",
)

K1, B = 2.0, 0.5  # the frequency term's BM25 constants (release)


def _fisher_two_sided(a, b, n_c: int, n_w: int) -> torch.Tensor:
    """(U,) two-sided Fisher exact p-values of the tables [[a, b], [n_c − a, n_w − b]] (hypergeometric, lgamma)."""
    K = a + b  # rollouts containing the token
    k = torch.arange(n_c + 1, dtype=torch.float64)[None, :]  # candidate a's
    valid = (k <= K[:, None]) & (K[:, None] - k <= n_w)

    def log_p(x):
        lc = lambda n, r: math.lgamma(n + 1) - torch.lgamma(r + 1) - torch.lgamma(n - r + 1)  # noqa: E731
        return lc(n_c, x) + lc(n_w, K[:, None] - x) - (math.lgamma(n_c + n_w + 1) - torch.lgamma(K[:, None] + 1)
                                                        - torch.lgamma(n_c + n_w - K[:, None] + 1))

    lp = torch.where(valid, log_p(k.clamp(max=n_c)), torch.tensor(-math.inf, dtype=torch.float64))
    observed = log_p(a[:, None].double())
    return torch.where(lp <= observed + 1e-7, lp.exp(), 0.0).sum(1).clamp(max=1.0)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    q = 1 - p
    return -(torch.where(p > 0, p * torch.log2(p.clamp(min=1e-300)), 0.0)
             + torch.where(q > 0, q * torch.log2(q.clamp(min=1e-300)), 0.0))


def key_token_scores(ids_GT: torch.Tensor, mask_GT: torch.Tensor, correct_G: torch.Tensor, *, alpha: float = 1.0,
                     beta_ig: float = 1.0, tf: bool = True, top: float = 1.0) -> torch.Tensor:
    """(G, T) kt of every real token of one group (0 on padding; all 0 unless the group has both outcomes)."""
    n_c, n_w = int(correct_G.sum()), int((~correct_G).sum())
    kt_GT = torch.zeros(ids_GT.shape, dtype=torch.float64)
    if n_c == 0 or n_w == 0:
        return kt_GT
    vocab, inverse = torch.unique(ids_GT[mask_GT], return_inverse=True)
    U, N = vocab.numel(), n_c + n_w
    index_GT = torch.full(ids_GT.shape, U, dtype=torch.long)
    index_GT[mask_GT] = inverse
    counts_GU = torch.zeros(ids_GT.shape[0], U + 1, dtype=torch.float64).scatter_add_(
        1, index_GT, torch.ones_like(index_GT, dtype=torch.float64))[:, :U]  # occurrences of each token per row
    present_GU = counts_GU > 0
    a, b = present_GU[correct_G].sum(0).double(), present_GU[~correct_G].sum(0).double()
    c, d = n_c - a, n_w - b
    p = _fisher_two_sided(a, b, n_c, n_w)
    fisher = torch.where(p < 1 - 1e-9, torch.exp(-2 * p), 0.0)  # p = 1 up to summation rounding: F = 0
    ig = _entropy(torch.tensor(n_c / N, dtype=torch.float64)) - (
        (a + b) / N * _entropy(a / (a + b).clamp(min=1e-300)) + (c + d) / N * _entropy(c / (c + d).clamp(min=1e-300)))
    x = (torch.asin(torch.sqrt((a / (a + c + 1e-10)).clamp(0, 1)))
         - torch.asin(torch.sqrt((b / (b + d + 1e-10)).clamp(0, 1))))
    if tf:
        t_c, t_w = float(mask_GT[correct_G].sum()), float(mask_GT[~correct_G].sum())
        avg = (t_c + t_w) / 2
        k_c, k_w = K1 * (1 - B + B * t_c / avg), K1 * (1 - B + B * t_w / avg)
        f_c, f_w = counts_GU[correct_G].sum(0) / t_c, counts_GU[~correct_G].sum(0) / t_w
        tf_c, tf_w = f_c * (K1 + 1) / (f_c + k_c), f_w * (K1 + 1) / (f_w + k_w)
        x = x + tf_c / (tf_w + 1e-5) - tf_w / (tf_c + 1e-5)
    score = (alpha * fisher + beta_ig * ig) * x / (alpha + beta_ig)
    kt_U = (torch.sigmoid(score) - 0.5) * 2 * top
    kt_GT[mask_GT] = kt_U[inverse]
    return kt_GT


def _probe(model, rows, options, generator) -> torch.Tensor:
    """(rows, T) kt, group by group (rows with equal prompts); correct = A > 0."""
    T = rows.answer_BT.shape[1]
    ids_BT, mask_BT = rows.input_ids_BL[:, -T:].cpu(), rows.attention_mask_BL[:, -T:].bool().cpu()
    if rows.tokenizer is not None:  # special tokens carry no key-token credit
        mask_BT = mask_BT & ~torch.isin(ids_BT, torch.tensor(rows.tokenizer.all_special_ids, dtype=ids_BT.dtype))
    prompts_BS = (rows.input_ids_BL[:, :-T] * rows.attention_mask_BL[:, :-T]).cpu()
    _, group_B = torch.unique(prompts_BS, dim=0, return_inverse=True)
    own = options.method_options
    kt_BT = torch.zeros(ids_BT.shape, dtype=torch.float64)
    for g in group_B.unique():
        rows_G = (group_B == g) & (rows.adv_B.cpu() != 0)
        kt_BT[rows_G] = key_token_scores(ids_BT[rows_G], mask_BT[rows_G], rows.adv_B.cpu()[rows_G] > 0,
                                         alpha=own["ktae_alpha"], beta_ig=own["ktae_beta_ig"], tf=own["ktae_tf"],
                                         top=own["ktae_top"])
    return kt_BT.to(rows.input_ids_BL.device, torch.float32)


def _pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    """w = 1 + kt / A on rows with A ≠ 0 (so that w·A = A + kt), 1 elsewhere; 0 on padding."""
    signal_BT, ok_B, fallback_B = TokenWeights.finite_signal(signal_BT.float(), mask_BT, rows_B)
    safe_B = torch.where(adv_B != 0, adv_B, torch.ones_like(adv_B)).float()
    ratio_BT = torch.where(ok_B[:, None], signal_BT / safe_B[:, None], torch.zeros_like(signal_BT))
    return TokenWeights.simple((1 + ratio_BT) * mask_BT.float(), spans, rows_B, fallback_B)


SPEC = MethodSpec(
    "ktae", "KTAE", _probe, _pipeline, rows="advantaged", groups=True, calls_model=False, preserves_mass=False,
    preserves_sign=False,
    importance=torch.abs,
    options=(MethodOption("ktae_alpha", 1.0, "weight of the Fisher-test association F", minimum=0.0),
             MethodOption("ktae_beta_ig", 1.0, "weight of the information gain IG", minimum=0.0),
             MethodOption("ktae_tf", True, "add the BM25-style frequency term to the direction (release: on)"),
             MethodOption("ktae_top", 1.0, "bound of |kt| (kt ∈ (−top, top))", minimum=0.0)),
    check=lambda options, config: ("ktae_alpha + ktae_beta_ig must be > 0" if options.method_options["ktae_alpha"]
                                   + options.method_options["ktae_beta_ig"] <= 0 else None),
    title="KTAE (key-token advantage: each token id's association with correct rollouts in its group, added to A)",
    summary=__doc__.split("\n\n")[1].replace("\n", " "),
    example="ktae_top=0.5", cost="no model call: counting token ids per group (milliseconds)",
    reference="Sun et al. 2025, arXiv 2505.16826 (KTAE); released code xiaolizh1/KTAE",
    open_choices=OPEN_CHOICES,
)
