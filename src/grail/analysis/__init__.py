"""What the weights do: saliency quality against ground truth (`grail.analysis.saliency`), `grail explain`
(`grail.analysis.explain`) and `grail compare` (`grail.analysis.compare`)."""
