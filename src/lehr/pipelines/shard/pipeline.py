from kedro.pipeline import Node, Pipeline

from lehr.pipelines.shard.nodes import shard_streams


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                shard_streams,
                ["token_streams", "tokenizer", "params:shard"],
                "shards",
                name="shard_streams_node",
            ),
        ]
    )
