"""The models a run starts from: the embedded tiny model (`tiny`), its warm start (`warmstart`), real pretrained
models by name (`pretrained`), the checks made before a run loads them (`checks`) and `grail models` (`cli`).
Nothing here knows the token-weighting methods."""
