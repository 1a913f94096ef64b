"""What the weights do: saliency quality against ground truth (`grail.analysis.saliency`), `grail explain`
(`grail.analysis.explain`) and `grail compare` (`grail.analysis.compare`); and whether a method keeps the method
contract (`grail.analysis.checks`: `check_method`, run on the embedded model, so above both models and methods)."""
