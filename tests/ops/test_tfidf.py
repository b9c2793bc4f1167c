"""TfIdfVectorizer on integer tokens against onnxruntime, through TF and TFLite."""

import numpy as np
import pytest

from harness import check_node, count_tflite_ops

rng = np.random.default_rng(5)

# unigrams 2, 3, 5, 7; bigrams (2, 3), (5, 5), (7, 2); trigram (2, 3, 5)
POOL = [2, 3, 5, 7, 2, 3, 5, 5, 7, 2, 2, 3, 5]
COUNTS = [0, 4, 10]
INDEXES = [0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("low, high, skips, shape, dtype", [
    (1, 1, 0, (3, 11), np.int64), (1, 2, 0, (12,), np.int32), (2, 3, 2, (2, 11), np.int32),
    (1, 3, 3, (14,), np.int64),
])
def test_tfidf_vectorizer(mode, low, high, skips, shape, dtype):
    x = rng.integers(1, 8, shape).astype(dtype)
    attrs = {
        "mode": mode, "min_gram_length": low, "max_gram_length": high,
        "max_skip_count": skips, "ngram_counts": COUNTS, "ngram_indexes": INDEXES,
        "pool_int64s": POOL,
    }
    if mode != "TF":
        attrs["weights"] = rng.uniform(0.5, 2, len(INDEXES)).astype(np.float32).tolist()
    converted = check_node("TfIdfVectorizer", {"x": x}, attrs, opset=9)
    assert_builtins_only(converted.tflite)


def test_tfidf_vectorizer_shared_output_columns():
    """Several n-grams may share one output column; unused columns stay zero."""
    x = rng.integers(1, 8, (2, 9)).astype(np.int64)
    attrs = {
        "mode": "TF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 1,
        "ngram_counts": [0, 4], "ngram_indexes": [5, 0, 5, 2, 1, 2],
        "pool_int64s": [2, 3, 5, 7, 2, 3, 5, 5],
    }
    converted = check_node("TfIdfVectorizer", {"x": x}, attrs, opset=9)
    assert_builtins_only(converted.tflite)


def assert_builtins_only(content: bytes) -> None:
    """EQUAL / LOGICAL_AND / SUM / matmul builtins: no Flex (Select TF) ops, no TRANSPOSE."""
    census = count_tflite_ops(content)
    assert "FULLY_CONNECTED" in census or "BATCH_MATMUL" in census, census
    assert not any(op.startswith("Flex") or op == "DELEGATE" for op in census), census
    assert "TRANSPOSE" not in census, census
