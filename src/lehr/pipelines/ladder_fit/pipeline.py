from kedro.pipeline import Node, Pipeline

from lehr.pipelines.ladder_fit.nodes import fit_ladder


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                fit_ladder,
                ["ladder_rungs", "params:ladder"],
                ["ladder_fit", "ladder_png"],
                name="fit_ladder_node",
            )
        ]
    )
