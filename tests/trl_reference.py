"""The GRPO-family loss with a (B, T) advantage, written from each option's formula (its paper, or TRL's docstring where
TRL defines the option; the source of each is the `source` of its row in grail.options.trl_matrix). The matrix tests
compare GRAILTrainer's loss and gradients with it; it is the slow, obvious version, one formula per line."""

import math

import torch


def ratio(cfg, logps_BT, old_BT, mask_BT):
    """r_t = π/π_old per token, or GSPO's one ratio per row: exp of the row's mean log-ratio (arXiv 2507.18071)."""
    log_r_BT = logps_BT - old_BT
    if cfg.importance_sampling_level == "sequence":
        m = mask_BT.float()
        return torch.exp((log_r_BT * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0))
    return torch.exp(log_r_BT)


def policy_term(cfg, r, adv_BT, logps_BT, old_BT, mask_BT, sampler_ratio_BT=None):
    """Each loss type's per-token policy loss, before masks and aggregation."""
    eps_low, eps_high = cfg.epsilon, cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    if cfg.loss_type == "cispo":  # MiniMax-M1: a detached, clipped ratio times Â log π
        return -torch.clamp(r, max=eps_high).detach() * adv_BT * logps_BT
    if cfg.loss_type == "sapo":  # SAPO: a soft gate σ(τ (r − 1)) · 4/τ, τ by the advantage's sign
        tau = torch.where(adv_BT > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
        return -torch.sigmoid(tau * (r - 1)) * 4 / tau * adv_BT
    if cfg.loss_type == "vespo":  # VESPO: φ(w) = e^λ w^k e^(−λ w), w = π/π_sampler of the whole row, detached
        log_w = ((logps_BT - old_BT) * mask_BT.float()).sum(-1, keepdim=True).detach()
        if sampler_ratio_BT is not None:  # π_old/π_sampler, where the batch carries it
            log_w = log_w + (torch.log(sampler_ratio_BT) * mask_BT.float()).sum(-1, keepdim=True)
        nonneg = adv_BT >= 0
        k = torch.where(nonneg, cfg.vespo_k_pos, cfg.vespo_k_neg)
        lam = torch.where(nonneg, cfg.vespo_lambda_pos, cfg.vespo_lambda_neg)
        return -torch.exp(lam + k * log_w - lam * torch.exp(log_w)) * adv_BT * logps_BT
    # PPO's clipped surrogate (DeepSeekMath), with INTELLECT-2's cap δ on the unclipped ratio
    capped = r if cfg.delta is None else torch.clamp(r, max=cfg.delta)
    return -torch.min(capped * adv_BT, torch.clamp(r, 1 - eps_low, 1 + eps_high) * adv_BT)


def aggregate(cfg, loss_BT, mask_BT, num_items):
    m = mask_BT.float()
    if cfg.loss_type in ("grpo", "sapo"):  # each row's mean over its tokens, then the mean over rows
        return ((loss_BT * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if cfg.loss_type == "bnpo":  # the micro-batch's tokens
        return (loss_BT * m).sum() / m.sum().clamp(min=1.0)
    if cfg.loss_type == "dr_grpo":  # rows × max_completion_length
        return (loss_BT * m).sum() / (loss_BT.shape[0] * cfg.max_completion_length)
    if cfg.loss_type == "luspo":  # each row's sum, the mean over rows
        return (loss_BT * m).sum(-1).mean()
    return (loss_BT * m).sum() / num_items  # dapo, cispo, vespo: the generation batch's tokens (one process, no accum)


def reference_loss(cfg, logps_BT, entropies_BT, batch, adv_BT, *, use_vllm=False, entropy_coef=None,
                   last_world_entropy=math.inf):
    """The loss of one micro-batch (gradient accumulation 1, one process) for config `cfg`, with the log-probs and
    entropies of the policy's forward (`logps_BT` carries the graph) and TRL's batch entries in `batch`;
    `entropy_coef`: the adaptive schedule's coefficient now (default: the config's), applied only where the last
    measured entropy is at most the target (Skywork-OR1)."""
    mask_BT, old_BT = batch["completion_mask"], batch["old_per_token_logps"]
    r = ratio(cfg, logps_BT, old_BT, mask_BT)
    loss_BT = policy_term(cfg, r, adv_BT, logps_BT, old_BT, mask_BT, batch.get("importance_sampling_ratio"))
    if cfg.off_policy_mask_threshold is not None:  # DeepSeek-V3.2 eq. 9: drop A < 0 rows far from the sampler
        m = mask_BT.float()
        kl_B1 = ((old_BT - logps_BT.detach()) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
        loss_BT = loss_BT * ((adv_BT >= 0) | (kl_B1 <= cfg.off_policy_mask_threshold)).float()
    entropy_keep = mask_BT.bool()
    if cfg.top_entropy_quantile < 1.0:  # Beyond the 80/20 rule: the top-ρ quantile of the tokens by entropy
        threshold = torch.quantile(entropies_BT.detach()[mask_BT.bool()].float(), 1 - cfg.top_entropy_quantile)
        entropy_keep = (entropies_BT.detach() >= threshold) & mask_BT.bool()
        loss_BT = loss_BT * entropy_keep.float()
    if use_vllm and cfg.vllm_importance_sampling_correction and cfg.loss_type != "vespo":
        loss_BT = loss_BT * batch["importance_sampling_ratio"]
    if cfg.beta != 0.0:  # k3 estimator of KL(π‖π_ref), times the ratio for the unbiased gradient
        d = batch["ref_per_token_logps"] - logps_BT
        kl_BT = torch.exp(d) - d - 1
        loss_BT = loss_BT + cfg.beta * (kl_BT * r if cfg.use_bias_correction_kl else kl_BT)
    loss = aggregate(cfg, loss_BT, mask_BT, batch["num_items_in_batch"])
    if cfg.entropy_coef != 0.0 or cfg.use_adaptive_entropy:  # L − c · H̄ over the tokens the loss keeps
        keep = entropy_keep.float()
        coef = cfg.entropy_coef if entropy_coef is None else entropy_coef
        if cfg.use_adaptive_entropy and last_world_entropy > cfg.entropy_target:
            coef = 0.0
        loss = loss - coef * (entropies_BT * keep).sum() / keep.sum().clamp(min=1.0)
    return loss
