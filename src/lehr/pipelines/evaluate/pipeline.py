from kedro.pipeline import Node, Pipeline

from lehr.pipelines.evaluate.nodes import evaluate_models, plot_tasks, plot_training_curves


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
                ["eval_metrics", "samples", "scored_items"],
                name="evaluate_models_node",
            ),
            Node(plot_tasks, "eval_metrics", "task_accuracy_png", name="plot_tasks_node"),
            Node(
                plot_training_curves,
                ["stable_curve", "anneal_curve", "params:pretrain"],
                ["curves", "loss_curve_png"],
                name="plot_curves_node",
            ),
        ]
    )
