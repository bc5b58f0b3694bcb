from kedro.pipeline import Node, Pipeline

from lehr.pipelines.evaluate.nodes import evaluate_models, plot_curves


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                evaluate_models,
                [
                    "shards",
                    "pre_anneal",
                    "anneal_branches",
                    "params:pretrain",
                    "params:anneal",
                    "params:evaluate",
                ],
                ["eval_metrics", "samples"],
                name="evaluate_models_node",
            ),
            Node(
                plot_curves,
                ["stable_curve", "anneal_curve"],
                ["curves", "loss_curve_png"],
                name="plot_curves_node",
            ),
        ]
    )
