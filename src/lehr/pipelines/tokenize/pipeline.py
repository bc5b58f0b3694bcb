from kedro.pipeline import Node, Pipeline

from lehr.pipelines.tokenize.nodes import tokenize


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                tokenize,
                ["corpus", "params:tokenize", "token_parts"],
                ["tokenizer", "token_streams"],
                name="tokenize_node",
            ),
        ]
    )
