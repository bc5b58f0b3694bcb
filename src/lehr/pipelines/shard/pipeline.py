from kedro.pipeline import Node, Pipeline

from lehr.pipelines.shard.nodes import heldout_tasks, shard_streams


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                shard_streams,
                ["token_streams", "tokenizer", "params:shard"],
                "shards",
                name="shard_streams_node",
            ),
            Node(
                heldout_tasks,
                ["token_streams", "tokenizer", "params:shard"],
                "heldout_tasks",
                name="heldout_tasks_node",
            ),
        ]
    )
