from kedro.pipeline import Node, Pipeline

from lehr.pipelines.soup.nodes import make_soup


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [Node(make_soup, ["anneal_branches", "params:soup"], "soup_branch", name="make_soup_node")]
    )
