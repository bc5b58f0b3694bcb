"""The special token every lehr tokenizer carries, named once for the data side and the engine."""

# Separates documents in the token streams (its id is the shards' ``eot_id``), starts every
# scored task example, and ends generation in lm-eval.
ENDOFTEXT = "<|endoftext|>"
