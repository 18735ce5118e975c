"""Percentile bootstrap intervals of a mean, the one implementation the faithfulness summary and the atlas share
(torch-free)."""

from __future__ import annotations

import warnings

import numpy as np


def bootstrap_interval(
    values: np.ndarray, resamples: int, level: float, seed: int, omit_nan: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval of the mean over the first axis of ``values`` (sample, ...): the samples
    are drawn with replacement ``resamples`` times (numpy's generator seeded with ``seed``; one draw matrix for
    every column, so the columns' intervals are paired), and the ``(1 - level) / 2`` tails of the resampled means
    cut off. Returns ``(low, high)``, each of shape ``values.shape[1:]``.

    ``omit_nan``: NaN samples are left out of each mean (a column that is NaN in every draw stays NaN); otherwise a
    NaN propagates. One sample gives a zero-width interval.
    """
    values = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))  # (resample, sample)
    tail = (1 - level) / 2 * 100
    if not omit_nan:
        means = values[draws].mean(axis=1)  # (resample, ...)
        low, high = np.percentile(means, [tail, 100 - tail], axis=0)
        return low, high
    with warnings.catch_warnings():  # "Mean of empty slice": a column whose values are all NaN stays NaN
        warnings.simplefilter("ignore", category=RuntimeWarning)
        means = np.nanmean(values[draws], axis=1)
        low, high = np.nanpercentile(means, [tail, 100 - tail], axis=0)
    return low, high
