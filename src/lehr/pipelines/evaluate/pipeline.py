from kedro.pipeline import Node, Pipeline

from lehr.pipelines.evaluate.nodes import evaluate_models, plot_curves, plot_tasks


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                evaluate_models,
                [
                    "shards",
                    "pre_anneal",
                    "branch_points",
                    "anneal_branches",
                    "heldout_tasks",
                    "user_tasks",
                    "params:pretrain",
                    "params:anneal",
                    "params:evaluate",
                ],
                ["eval_metrics", "samples"],
                name="evaluate_models_node",
            ),
            Node(plot_tasks, "eval_metrics", "task_accuracy_png", name="plot_tasks_node"),
            Node(
                plot_curves,
                ["stable_curve", "anneal_curve"],
                ["curves", "loss_curve_png"],
                name="plot_curves_node",
            ),
        ]
    )
