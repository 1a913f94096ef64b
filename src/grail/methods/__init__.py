"""The token-weighting methods, without TRL: pure tensor functions (`core`, `bilevel`, `spans`, `diagnostics`), the
probes that run the model (`probes`, `oar_probes`), the table of methods (`table`) and the functional API
(`weighting`, also exported by the `grail` package: `from grail import grail_weights`)."""
