"""Gaussian clusters, one per class: a labelled data set made from a seed, nothing downloaded."""

from __future__ import annotations

import numpy as np

SPLITS = ("train", "dev", "test")


def make_clusters(examples: int, features: int, classes: int, spread: float, seed: int) -> dict[str, dict]:
    """{split: {"x": float32 (n, features), "y": int32 (n,)}}: 80% train, 10% dev, 10% test of `examples`.

    Class k's points are its centre plus normal noise of standard deviation
    `spread` per feature; centres are about sqrt(2) apart (each feature drawn
    with variance 1/features), so `spread` sets how separable the classes are.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, features)) / np.sqrt(features)
    y = rng.integers(0, classes, size=examples).astype(np.int32)
    x = (centres[y] + spread * rng.normal(size=(examples, features))).astype(np.float32)
    ends = {"train": int(0.8 * examples), "dev": int(0.9 * examples), "test": examples}
    splits, start = {}, 0
    for split in SPLITS:
        splits[split] = {"x": x[start : ends[split]], "y": y[start : ends[split]]}
        start = ends[split]
    return splits
