"""The data side: reading a corpus of any size (``corpus``), the tokenizer (``tokenization``),
token streams (``token_index``: their layout; ``token_writer``, ``token_reader``) and shards
(``sharding``).

Plain Python (no Kedro); the tokenize and shard stages call it through ``lehr.pipelines``."""
