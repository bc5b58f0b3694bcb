"""The data side: reading a corpus of any size (``corpus``; ``bundled_corpus`` lays out the default
one), the tokenizer (``tokenization``), token streams (``token_index``: their layout;
``token_writer``, ``token_reader``), shards (``sharding``), the tasks made from the held-out split
(``builtin_tasks``) and the data stages' params (``params``).

Plain Python (no Kedro); the tokenize and shard stages call it through ``lehr.pipelines``."""
