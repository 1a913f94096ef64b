"""OAR-P learned online from a few exact rows a step (`--token_weighting oar_p_amortized`).

Why: OAR-P (docs/methods/oar_p.md) is the one signal that finds the reasoning with position held fixed, and it costs a
forward of the row's suffix for every scored token: T²/2 positions a row. This method computes exact OAR-P on a few
rows of each probe call and predicts it on the others from what one clean forward gives, as amortized attribution
does (an explainer trained to predict an expensive attribution: FastSHAP; amortized Shapley values for text,
arXiv 2305.19998).

Each probe call, on the rows OAR-P would probe (its rows, its scored tokens):
  1. one no-grad forward of every row gives each scored token's features x_t: the hidden state at the token's own
     position after the decoder layer `oar_p_amortized_layer` (RMS-normalised, then a fixed random projection to
     `oar_p_amortized_features` dimensions: the same matrix for every run of a model width, seeded, never learned),
     the token's surprise −log π(y_t) and the entropy of the distribution it was drawn from (at the predicting
     position, the sampling temperature), its place in the row (t / n), and a constant;
  2. `oar_p_amortized_exact_rows` of the rows, drawn with the trainer's generator, get exact OAR-P (OAR-P's own
     probe); their scored tokens' (x_t, log max(I_t, floor)) update the predictor. With
     `oar_p_amortized_exact_tokens` = N > 0, only N of those rows' scored tokens, drawn at random, get OAR-P's
     perturbed copy (a cost of N suffixes, whatever the length: at 1,024 tokens a whole row is 1,024 of them), and
     every row, those too, gets the prediction. With
     `oar_p_amortized_exact_every` = k, only every k-th call does (and any call before the first fit): a trainer
     probes each micro-batch, so k = gradient_accumulation_steps buys the exact rows once an optimizer step;
  3. the other rows get I_t = exp(x_t · θ), θ the ridge regression of log-importance on the features over every
     exact token seen so far, older calls discounted by `oar_p_amortized_decay` per call;
  4. OAR-P's bi-level reshaping turns the signal into weights, as for OAR-P.
In a trainer on the fused path (`fuse="probe"`, `saliency_path`), step 1's forward is TRL's own training forward:
the layer's output is captured there and the surprise and entropy are TRL's log-probs and entropies of that forward,
so the features cost nothing beyond it and the exact rows' OAR-P is the only model call left (`_fused_probe`; the
same features, `features_from`, to float rounding).

The target is log-importance, a regression: OAR-P's KLs span several orders of magnitude (1e-8 to 1 nats on one row),
the bi-level reshaping reads each row's order and relative size, and the log makes a squared error weigh the
critical tokens' orders of magnitude rather than their absolute KLs. A ridge fit by its sufficient statistics
(Σ x xᵀ, Σ x y, discounted) is deterministic, exact to resume (the statistics are the whole state), costs F² a token,
and needs no learning rate. The regulariser is `oar_p_amortized_ridge` × mean(diag Σ x xᵀ), so it does not depend on
the features' scale or on how many tokens have been seen; it leaves the constant alone (an intercept is not shrunk).

State (`MethodSpec.state`, `Predictor`): the two sums and the count of exact tokens; the trainer keeps one per process
and saves it with each checkpoint. Outside a trainer each call starts from nothing and fits on its own exact rows.
"""

from __future__ import annotations

import torch

from grail.methods import probes
from grail.methods.builtin import BILEVEL_READS, bilevel_pipeline, oar_p_floor, oar_p_signal
from grail.methods.core import entropy_from_logits
from grail.methods.output_layer import per_position_BT
from grail.methods.sharding import unsharded
from grail.methods.spans import align_to_completion
from grail.methods.spec import MethodOption, MethodSpec, ProbeBatch, TrainingReads
from grail.options.choices import WeightingOptions

__all__ = ["SPEC", "Predictor", "features_from", "token_features"]

EXACT_ROWS = "oar_p_amortized_exact_rows"
LAYER = "oar_p_amortized_layer"
FEATURES = "oar_p_amortized_features"
RIDGE = "oar_p_amortized_ridge"
DECAY = "oar_p_amortized_decay"
EVERY = "oar_p_amortized_exact_every"
EXACT_TOKENS = "oar_p_amortized_exact_tokens"
SCALARS = 4  # surprise, entropy, place in the row, constant
PROJECTION_SEED = 0


class Predictor:
    """The ridge regression of log-importance on the features, by its discounted sufficient statistics (float64)."""

    def __init__(self):
        self.xx_FF: torch.Tensor | None = None  # Σ x xᵀ
        self.xy_F: torch.Tensor | None = None  # Σ x y
        self.tokens = 0.0  # discounted count of exact tokens
        self.calls = 0  # probe calls that updated it
        self.probe_calls = 0  # probe calls that read it (`EVERY`: which of them compute exact rows)

    def update(self, x_NF: torch.Tensor, y_N: torch.Tensor, decay: float) -> None:
        x, y = x_NF.double().cpu(), y_N.double().cpu()
        if self.xx_FF is not None and self.xx_FF.shape[0] != x.shape[1]:
            raise ValueError(
                f"oar_p_amortized: the predictor was fitted on {self.xx_FF.shape[0]} features a token and this call "
                f"gives {x.shape[1]}: {FEATURES} or the model's width changed since its state was saved (a resumed "
                f"run keeps both). Resume with the options the run started with, or start the run afresh.")
        if self.xx_FF is None:
            self.xx_FF, self.xy_F, self.tokens = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64), \
                torch.zeros(x.shape[1], dtype=torch.float64), 0.0
        self.xx_FF = decay * self.xx_FF + x.T @ x
        self.xy_F = decay * self.xy_F + x.T @ y
        self.tokens = decay * self.tokens + x.shape[0]
        self.calls += 1

    def coefficients(self, ridge: float) -> torch.Tensor:
        """θ (F,) float64: (Σ x xᵀ + λ P)⁻¹ Σ x y, λ = ridge × mean(diag Σ x xᵀ) (and at least 1e-12), P the
        identity but for the last feature, the constant, which is not penalised: log-importance sits far below 0,
        and a penalised constant hands its mean to the other features (a strong ridge reversed each row's order)."""
        if self.xx_FF is None:
            raise RuntimeError("oar_p_amortized: the predictor has seen no exact token yet")
        scale = max(float(self.xx_FF.diagonal().mean()), 1e-12)
        penalty_F = torch.ones(self.xx_FF.shape[0], dtype=torch.float64)
        penalty_F[-1] = 0.0
        # the constant's own 1e-12 keeps the system solvable before any token has a non-zero constant
        system = self.xx_FF + torch.diag(max(ridge * scale, 1e-12) * penalty_F + 1e-12 * (1 - penalty_F))
        return torch.linalg.solve(system, self.xy_F)

    def state_dict(self) -> dict:
        return {"xx_FF": self.xx_FF, "xy_F": self.xy_F, "tokens": self.tokens, "calls": self.calls,
                "probe_calls": self.probe_calls}

    def load_state_dict(self, state: dict) -> None:
        self.xx_FF, self.xy_F = state["xx_FF"], state["xy_F"]
        self.tokens, self.calls = float(state["tokens"]), int(state["calls"])
        self.probe_calls = int(state.get("probe_calls", state["calls"]))  # a state saved before the counter


def _projection(width: int, features: int, device) -> torch.Tensor:
    """(D, F') the fixed random projection of a D-wide hidden state (F' = min(F, D)); the identity when F ≥ D."""
    if features >= width:
        return torch.eye(width, device=device)
    generator = torch.Generator().manual_seed(PROJECTION_SEED)
    return (torch.randn(width, features, generator=generator) / features ** 0.5).to(device)


def token_features(model, rows: ProbeBatch, options: WeightingOptions) -> torch.Tensor:
    """(rows, T, F) float32 features of every completion token (0 on padding): the projected hidden state after
    `LAYER` at the token's own position, then surprise, entropy, t / n and 1. One no-grad forward."""
    T = rows.scored_BT.shape[1]
    mask_BT = probes.completion_mask_BT(rows.attention_mask_BL, T)
    method = options.method_options
    with torch.no_grad(), unsharded(model), probes.output_of(probes.leaf_module(model, method[LAYER])) as captured:
        final_BLD = probes.hidden_states_BLD(model, rows.attention_mask_BL, input_ids=rows.input_ids_BL)
        predicting_BTD = align_to_completion(final_BLD, T, at="predicting")
        targets_BT = rows.input_ids_BL[:, -T:]

        def surprise_and_entropy(logits_NV, r, c):
            logp_NV = torch.log_softmax(logits_NV, dim=-1)
            return torch.stack([-logp_NV.gather(1, targets_BT[r, c, None])[:, 0], entropy_from_logits(logits_NV)], 1)

        read_BT2 = per_position_BT(model, predicting_BTD, mask_BT, options.temperature, surprise_and_entropy, width=2)
    return features_from(captured[-1], read_BT2[..., 0], read_BT2[..., 1], rows.attention_mask_BL, options)


def features_from(layer_BLD: torch.Tensor, surprise_BT: torch.Tensor, entropy_BT: torch.Tensor,
                  attention_mask_BL: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(rows, T, F) float32 features (`token_features`) from what a forward gives: the output of the layer `LAYER`
    (B, L', D, its last T positions the completion's), each token's surprise −log π(y_t) and the entropy of the
    distribution it was drawn from, at the sampling temperature (B, T). Pure: the probe's own forward and the
    trainer's training forward (`fused_probe`) both end here."""
    T = surprise_BT.shape[1]
    mask_BT = probes.completion_mask_BT(attention_mask_BL, T)
    layer_BTD = align_to_completion(layer_BLD, T, at="token").float()
    hidden_BTD = layer_BTD / layer_BTD.pow(2).mean(-1, keepdim=True).add(1e-12).sqrt()
    projected_BTF = hidden_BTD @ _projection(hidden_BTD.shape[-1], options.method_options[FEATURES],
                                             hidden_BTD.device)
    lengths_B1 = mask_BT.sum(1, keepdim=True).clamp(min=1)
    place_BT = torch.arange(T, device=mask_BT.device)[None].float() / lengths_B1
    extra_BTS = torch.stack([surprise_BT.float(), entropy_BT.float(), place_BT.expand_as(surprise_BT),
                             torch.ones_like(surprise_BT, dtype=torch.float32)], -1)
    return torch.cat([projected_BTF, extra_BTS], -1) * mask_BT[..., None]


def _exact_rows(n: int, budget: int, generator: torch.Generator | None) -> torch.Tensor:
    """(n,) bool on the CPU: `budget` rows drawn without replacement from `generator` (all of them when n ≤ budget)."""
    device = generator.device if generator is not None else "cpu"
    order = torch.randperm(n, generator=generator, device=device).cpu()
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[order[:budget]] = True
    return chosen


def _exact_tokens(scored_NT: torch.Tensor, budget: int, generator: torch.Generator | None) -> torch.Tensor:
    """(N, T) bool: `budget` of the scored tokens, drawn as `_exact_rows` draws rows, over all N rows (all of them
    when they are fewer)."""
    index = scored_NT.flatten().nonzero().squeeze(1)
    chosen = torch.zeros(scored_NT.numel(), dtype=torch.bool, device=scored_NT.device)
    chosen[index[_exact_rows(index.numel(), budget, generator).to(index.device)]] = True
    return chosen.view_as(scored_NT)


def _probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    """The probe: features from a no-grad forward of its own (`token_features`), then `_fit_and_predict`."""
    return _fit_and_predict(model, rows, options, generator, lambda: token_features(model, rows, options))


def _fused_probe(model, rows: ProbeBatch, reads: TrainingReads, options: WeightingOptions, generator) -> torch.Tensor:
    """The probe read from the training forward (`fuse="probe"`): the same features from TRL's log-probs and
    entropies and the layer's output captured there, so the only model calls left are the exact rows' OAR-P."""
    return _fit_and_predict(model, rows, options, generator, lambda: features_from(
        reads.hidden_BLD, -reads.logps_BT, reads.entropies_BT, rows.attention_mask_BL, options))


def _fit_and_predict(model, rows: ProbeBatch, options: WeightingOptions, generator, features) -> torch.Tensor:
    """Steps 2-3 of the module docstring on `rows`, with `features()` → (rows, T, F) the tokens' features."""
    method = options.method_options
    predictor = rows.state if rows.state is not None else Predictor()
    scored_BT = rows.scored_BT.bool()
    fits = predictor.xx_FF is None or predictor.probe_calls % method[EVERY] == 0
    predictor.probe_calls += 1
    budget = method[EXACT_ROWS] if fits else 0
    exact_B = _exact_rows(scored_BT.shape[0], budget, generator).to(scored_BT.device)
    features_BTF = features()
    signal_BT = torch.zeros(scored_BT.shape, dtype=torch.float32, device=scored_BT.device)
    tokens = method[EXACT_TOKENS]  # 0: the exact rows' every scored token, each row's exact values its signal
    if exact_B.any():  # a call that only predicts (`EVERY`) runs no exact OAR-P
        exact_scored_BT = scored_BT[exact_B]
        if tokens:  # a token budget: OAR-P's copies for `tokens` of the exact rows' scored tokens only
            exact_scored_BT = _exact_tokens(exact_scored_BT, tokens, generator)
        exact = rows._replace(input_ids_BL=rows.input_ids_BL[exact_B],
                              attention_mask_BL=rows.attention_mask_BL[exact_B], answer_BT=rows.answer_BT[exact_B],
                              scored_BT=exact_scored_BT)
        importance_BT = oar_p_signal(model, exact, options)  # OAR-P's own probe, token by token
        if not tokens:
            signal_BT[exact_B] = importance_BT.float()
        floor = max(oar_p_floor(model, options), 1e-12)  # the log's floor: OAR-P's rounding floor
        exact_features_BTF = features_BTF[exact_B]
        # a token whose features or importance are not finite (a broken forward) stays out of the fit: its row falls
        # back to uniform weights by the pipeline's rule, and the predictor is not poisoned for the other rows
        train_NT = exact_scored_BT & torch.isfinite(importance_BT) & torch.isfinite(exact_features_BTF).all(-1)
        if train_NT.any():
            predictor.update(exact_features_BTF[train_NT], importance_BT.float()[train_NT].clamp(min=floor).log(),
                             method[DECAY])
    rest_B = ~exact_B if not tokens else torch.ones_like(exact_B)  # a token budget: every row predicted
    if rest_B.any() and predictor.xx_FF is not None:
        theta_F = predictor.coefficients(method[RIDGE]).float().to(features_BTF.device)
        predicted_BT = (features_BTF[rest_B] @ theta_F).clamp(max=30.0).exp()
        signal_BT[rest_B] = torch.where(scored_BT[rest_B], predicted_BT, torch.zeros_like(predicted_BT))
    return signal_BT


SPEC = MethodSpec(
    "oar_p_amortized", "OAR-P (amortized)", _probe, bilevel_pipeline, rows="bilevel", min_importance=oar_p_floor,
    reads=BILEVEL_READS + ("answer_nll_span", "oar_min_importance", "perturbation_chunk_tokens", "saliency_path"),
    auroc=False,
    state=Predictor, fuse="probe", fused_probe=_fused_probe, fused_leaf=lambda options: options.method_options[LAYER],
    options=(
        MethodOption(EXACT_ROWS, 2, "rows of each probe call scored by exact OAR-P (the predictor's training data); "
                     "the others get the prediction", minimum=1),
        MethodOption(EXACT_TOKENS, 0, "a budget of scored tokens instead of whole rows: exact OAR-P (one perturbed "
                     "copy each) for this many of the exact rows' scored tokens, drawn at random, as the fit's data, "
                     "and every row, the exact rows too, predicted (0: the exact rows' every token, and their exact "
                     "values as their signal)", minimum=0),
        MethodOption(LAYER, "last", "the decoder layer whose output at the token's position is the feature",
                     choices=("embeddings", "first", "middle", "last")),
        MethodOption(FEATURES, 64, "dimensions of the hidden state's fixed random projection (the width itself "
                     "or more: no projection)", minimum=1),
        MethodOption(RIDGE, 0.001, "the ridge regulariser, relative to the mean diagonal of Σ x xᵀ", minimum=0.0),
        MethodOption(DECAY, 0.95, "each earlier fitting call's weight in the fit, per call (1: every call alike)",
                     minimum=0.0, maximum=1.0),
        MethodOption(EVERY, 1, "exact rows on every k-th probe call only (and on the first), the others all "
                     "predicted: a probe call is a micro-batch, so k = gradient_accumulation_steps gives "
                     "oar_p_amortized_exact_rows exact rows an optimizer step", minimum=1),
    ),
    title="OAR-P learned online: exact OAR-P on a few rows a step, a ridge predictor of log-importance on the rest",
    summary="Each probe call scores a few rows with exact OAR-P, adds their tokens to a ridge regression of "
            "log-importance on features one clean forward gives (a layer's hidden state, randomly projected; the "
            "token's surprise and entropy; its place), and gives the other rows the prediction; OAR-P's bi-level "
            "reshaping turns either into weights. The regression's sums are the method's state, saved with "
            "checkpoints (grail-rl's own method).",
    example="oar_p_amortized_exact_rows=1, oar_p_amortized_layer='last'",
    cost="exact OAR-P on oar_p_amortized_exact_rows rows, plus (unless fused with TRL's forward, which gives the "
         "features) one no-grad forward of every probed row and the output layer at its completion positions",
    reference="grail-rl; OAR-P: Li et al. 2026, arXiv 2601.07408 (OAR); amortized attribution: Yang et al. 2023, "
              "arXiv 2305.19998",
)
