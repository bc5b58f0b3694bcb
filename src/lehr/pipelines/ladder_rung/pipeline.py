from kedro.pipeline import Node, Pipeline

from lehr.pipelines.ladder_rung.nodes import train_ladder_rung


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                train_ladder_rung,
                [
                    "shards",
                    "ladder_runs",
                    "heldout_tasks",
                    "params:pretrain",
                    "params:anneal",
                    "params:ladder",
                ],
                "ladder_rungs",
                name="train_ladder_rung_node",
            )
        ]
    )
