"""TfIdfVectorizer over integer token ids (pool_int64s; string pools are out of scope).

Counting rule (the ONNX reference's): an n-gram of the pool with min_gram_length <= n <=
max_gram_length is counted at every start position and every skip distance d (tokens d
apart), d from 1 to max_skip_count + 1, where all n tokens fit in the row; unigrams are
counted once (d = 1 only). Each (n, d) pair compares n shifted slices of the row with the
pool's n-grams at once (EQUAL, LOGICAL_AND, SUM in TFLite), and one constant matrix maps the
pool's n-grams to output columns.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler


def pool_ngrams(pool: np.ndarray, counts: list[int]) -> dict[int, np.ndarray]:
    """{n: array (number of n-grams, n)} from the flat pool and the start of each size's run."""
    grams = {}
    for n, start in enumerate(counts, start=1):
        end = counts[n] if n < len(counts) else len(pool)
        if end > start:
            grams[n] = pool[start:end].reshape(-1, n)
    return grams


def _count_ngrams(x, grams: np.ndarray, n: int, distances: range, length: int, ctx):
    """[rows, len(grams)] occurrence counts of each n-gram of `grams` in the rows of x."""
    total = None
    for d in distances:
        span = length - (n - 1) * d
        if span <= 0:
            break
        match = None
        for k in range(n):
            tokens = x[:, k * d: k * d + span, None]  # [rows, span, 1]
            hit = tf.equal(tokens, ctx.const_tensor(grams[None, None, :, k].astype(np.int64)))
            match = hit if match is None else tf.logical_and(match, hit)
        found = tf.reduce_sum(tf.cast(match, tf.float32), axis=1)
        total = found if total is None else total + found
    return total


@handler("TfIdfVectorizer", since=9, limits="integer pools (pool_int64s); static row length")
def tfidf_vectorizer(ctx):
    if ctx.attr("pool_strings") is not None:
        raise NotImplementedError("TfIdfVectorizer with a string pool (strings are not supported)")
    indexes = np.asarray(ctx.attr("ngram_indexes"), np.int64)
    out_size = int(indexes.max()) + 1
    low, high = ctx.attr("min_gram_length"), ctx.attr("max_gram_length")
    skips = ctx.attr("max_skip_count")
    x = tf.cast(ctx.x(0), tf.int64)
    vector = ctx.rank(0) < 2
    x = tf.reshape(x, [1, -1]) if vector else x
    length = ctx.shape(0)[-1] if ctx.rank(0) else 1
    if length is None:
        raise NotImplementedError("TfIdfVectorizer with an unknown row length")
    pool = np.asarray(ctx.attr("pool_int64s"), np.int64)
    counts, columns, offset = [], [], 0
    for n, grams in pool_ngrams(pool, list(ctx.attr("ngram_counts"))).items():
        if low <= n <= high:
            distances = range(1, 2) if n == 1 else range(1, skips + 2)
            found = _count_ngrams(x, grams, n, distances, length, ctx)
            if found is not None:
                counts.append(found)
                columns.extend(indexes[offset: offset + len(grams)])
        offset += len(grams)
    rows = tf.shape(x)[0]
    if not counts:
        y = tf.zeros(tf.stack([rows, out_size]), tf.float32)
    else:
        scatter = np.zeros((len(columns), out_size), np.float32)
        scatter[np.arange(len(columns)), columns] = 1
        y = tf.matmul(tf.concat(counts, axis=1), ctx.const_tensor(scatter))
    weights = ctx.attr("weights")
    mode = ctx.attr("mode")
    if mode == "IDF":
        y = tf.cast(y > 0, tf.float32)
    if mode in ("IDF", "TFIDF") and weights is not None:
        y = y * ctx.const_tensor(np.asarray(weights, np.float32))
    return tf.reshape(y, [out_size]) if vector else y
