"""grail-rl: GRPO with token-level credit assignment on top of TRL.

Shape letters, one legend for the whole package (suffixes on tensor names, e.g. `weights_BT`, `logits_NV`):
    B  rows of a training batch: completions (G per prompt, each group contiguous)
    T  completion tokens (the right-padded completion block)
    S  prompt tokens (the left-padded prompt block); L = S + T, the model's input positions
    D  hidden size              V  vocabulary
    N  items flattened from several rows, or samples per problem    C  copies of a row (OAR-P's perturbed copies)
    P  problems of a benchmark  R  bootstrap resamples     M  metrics stacked together   K  values of k (pass@k)
Masks are bool with True = real token. docs/reference/layers.md shows the layers.
"""

__version__ = "0.1.0"
