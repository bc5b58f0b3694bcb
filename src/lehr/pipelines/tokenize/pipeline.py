from kedro.pipeline import Node, Pipeline

from lehr.pipelines.tokenize.nodes import encode_corpus, train_tokenizer


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(train_tokenizer, ["corpus", "params:tokenize"], "tokenizer", name="train_tokenizer_node"),
        Node(encode_corpus, ["corpus", "tokenizer", "params:tokenize", "token_parts"], "token_streams",
             name="encode_corpus_node"),
    ])
