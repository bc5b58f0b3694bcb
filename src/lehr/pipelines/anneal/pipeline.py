from kedro.pipeline import Node, Pipeline

from lehr.pipelines.anneal.nodes import summarize_anneal, train_anneal


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                train_anneal,
                [
                    "shards",
                    "pre_anneal",
                    "branch_points",
                    "anneal_runs",
                    "heldout_tasks",
                    "anneal_branches",
                    "params:pretrain",
                    "params:anneal",
                ],
                ["anneal_branch", "anneal_summary_raw"],
                name="train_anneal_node",
            ),
            Node(
                summarize_anneal,
                "anneal_summary_raw",
                ["anneal_metrics", "anneal_curve", "anneal_timing"],
                name="summarize_anneal_node",
            ),
        ]
    )
