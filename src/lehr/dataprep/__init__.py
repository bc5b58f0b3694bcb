"""The data side: reading a corpus of any size, the tokenizer, token streams and shards.

Plain Python (no Kedro); the tokenize and shard stages call it through ``lehr.pipelines``."""
