from kedro.pipeline import Node, Pipeline

from lehr.pipelines.pretrain_stable.nodes import summarize_stable, train_stable


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                train_stable,
                ["shards", "stable_run", "heldout_tasks", "params:pretrain"],
                ["pre_anneal", "branch_points", "stable_summary_raw"],
                name="train_stable_node",
            ),
            Node(
                summarize_stable,
                "stable_summary_raw",
                ["stable_metrics", "stable_curve", "stable_timing"],
                name="summarize_stable_node",
            ),
        ]
    )
