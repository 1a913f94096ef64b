"""Saliency quality: ground-truth token labels and the AUROC (`token_labels`), run over the methods (`quality`)."""
