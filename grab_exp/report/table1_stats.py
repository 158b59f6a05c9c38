"""Table 1's tests: each GraB row against RR (functional), and the GraB rows against each other,
paired by seed, with Holm's adjustment over each family of tests.

Every row of one seed starts from the same model and its first epoch visits the same
permutation, so a row's value minus RR's of the same seed removes what the seed alone decides.
Per comparison, metric and window (one epoch, or the mean over the last :data:`WINDOW` epochs of
each run), the test is the two-sided paired t-test (:func:`scipy.stats.ttest_rel`, ``n - 1``
degrees of freedom over ``n`` seeds) and, beside it, the exact Wilcoxon signed-rank test
(:func:`scipy.stats.wilcoxon`), whose two-sided p cannot go below ``2 / 2**n`` (0.25 at 3 seeds):
it can say the sign is not consistent, never that it is significant at 3 seeds. All five GraB
rows of a seed are compared with the same RR run, so the tests of one family are not
independent; Holm's step-down adjustment (:func:`holm`) holds under any dependence.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grab_exp.report.table1_rows import BASELINE, GRAB_ROWS, row_label, row_rank

#: metric column -> (its name in the tables, +1 when higher is better, -1 when lower is)
METRICS = {"train/loss": ("train loss", -1), "test/acc": ("test accuracy", 1)}
#: the late window: each run's mean over its last WINDOW epochs (one epoch is noisy late on)
WINDOW = 10
#: the families Holm's adjustment runs over (their tests: :func:`questions`)
FAMILY_VS_RR = "GraB vs RR, final"
FAMILY_VS_RR_EARLY = "GraB vs RR, early"
FAMILY_PAIRS = "GraB vs GraB, final"
#: differences whose sample std is at most this fraction of the values' magnitude have no spread:
#: equal on every seed but for float rounding (about 1e-16 of it), where a t statistic would be
#: rounding noise over rounding noise (t 1.2e16, p 6e-33 for 0.3, 0.5, 0.7 minus 0.1, 0.3, 0.5)
NO_SPREAD = 1e-12


@dataclass(frozen=True)
class Window:
    """Epochs whose per-run mean is compared: one epoch, or the last :data:`WINDOW`.

    Attributes:
        label: How the tables name it, e.g. ``epoch 100`` or ``epochs 91-100 (mean)``.
        epochs: The epochs averaged (one for a single epoch).
    """

    label: str
    epochs: tuple[int, ...]


@dataclass(frozen=True)
class PairedTest:
    """One paired comparison over ``n`` seeds (differences: the row minus the other row).

    Attributes:
        n: Seeds in both rows.
        mean: Mean difference.
        sd: Sample std (ddof 1) of the differences.
        t: The paired t statistic (NaN when the differences have no spread: :data:`NO_SPREAD`).
        p: Its two-sided p-value, ``n - 1`` degrees of freedom (NaN without spread).
        signed_rank_p: Exact two-sided Wilcoxon signed-rank p (NaN with a zero difference).
        better: Seeds on the better side for the first row (lower loss, higher accuracy).
        ci_low: Lower end of the 95% t-interval of the mean difference (NaN without spread).
        ci_high: Its upper end.
    """

    n: int
    mean: float
    sd: float
    t: float
    p: float
    signed_rank_p: float
    better: int
    ci_low: float = float("nan")
    ci_high: float = float("nan")


def paired_test(values: Sequence[float], others: Sequence[float], sign: int) -> PairedTest:
    """The paired t-test and signed-rank test of ``values - others`` (one pair per seed).

    Args:
        values: The first row's value per seed.
        others: The other row's value per seed, in the same seed order.
        sign: +1 when a higher value is better, -1 when a lower one is.

    Returns:
        The test; its t and p are NaN (``n/a`` in the tables) when the differences have no
        spread (:data:`NO_SPREAD`): a difference equal on every seed has no p-value.

    Raises:
        ValueError: fewer than 2 pairs, or the two lengths differ.
    """
    from scipy import stats  # the report's only SciPy use: imported where it is needed

    a, b = np.asarray(values, dtype=float), np.asarray(others, dtype=float)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"a paired test needs two equal lists of >= 2 values, got {len(a)}, {len(b)}"
        )
    diff = a - b
    sd = float(diff.std(ddof=1))
    t = p = low = high = float("nan")
    if sd > NO_SPREAD * float(np.abs(np.concatenate([a, b])).max()):
        result = stats.ttest_rel(a, b)
        t, p = float(result.statistic), float(result.pvalue)
        low, high = map(float, result.confidence_interval(0.95))
    rank_p = float("nan")
    if np.all(diff != 0):
        rank_p = float(stats.wilcoxon(diff, method="exact").pvalue)
    better = int((diff * sign > 0).sum())
    return PairedTest(len(a), float(diff.mean()), sd, t, p, rank_p, better, low, high)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (NaN stays NaN, outside the count).

    The k-th smallest of m p-values becomes ``max over j <= k of (m - j + 1) p_(j)``, capped at 1:
    the family-wise error rate of rejecting every adjusted p below alpha is at most alpha,
    whatever the tests' dependence.
    """
    finite = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    adjusted, running = [float("nan")] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - rank) * p))
        adjusted[i] = running
    return adjusted


def windows(last_epoch: int, early_epoch: int) -> dict[str, list[Window]]:
    """The windows of each family: the early epoch; the last epoch and, when the runs are at
    least twice :data:`WINDOW` epochs long, the mean of their last :data:`WINDOW` epochs."""
    final = [Window(f"epoch {last_epoch}", (last_epoch,))]
    if last_epoch >= 2 * WINDOW:
        epochs = tuple(range(last_epoch - WINDOW + 1, last_epoch + 1))
        final.append(Window(f"epochs {epochs[0]}-{epochs[-1]} (mean)", epochs))
    early = [Window(f"epoch {early_epoch}", (early_epoch,))] if early_epoch < last_epoch else []
    return {FAMILY_VS_RR: final, FAMILY_VS_RR_EARLY: early, FAMILY_PAIRS: final}


def questions(rows: Sequence[tuple[str, str]], last_epoch: int, early_epoch: int):
    """Every test as ``(family, window, row, other)``: each GraB row in ``rows`` against RR
    (functional) in the early and the final windows, and each pair of them in the final ones."""
    grab = [row for row in GRAB_ROWS if row in rows]
    grab += sorted(
        (r for r in rows if r not in GRAB_ROWS and r[0] != BASELINE[0]), key=lambda r: row_rank(*r)
    )
    spans = windows(last_epoch, early_epoch)
    for family in (FAMILY_VS_RR, FAMILY_VS_RR_EARLY):
        if BASELINE in rows:
            for window, row in itertools.product(spans[family], grab):
                yield family, window, row, BASELINE
    for window, (row, other) in itertools.product(
        spans[FAMILY_PAIRS], itertools.combinations(grab, 2)
    ):
        yield FAMILY_PAIRS, window, row, other


def window_means(frame: pd.DataFrame, window: Window) -> pd.DataFrame:
    """Per ``(variant, pipeline)`` and seed, the mean of each metric over ``window``'s epochs;
    runs that lack one of them are left out."""
    part = frame[frame["epoch"].isin(window.epochs)]
    counts = part.groupby(["variant", "pipeline", "seed"])["epoch"].nunique()
    means = part.groupby(["variant", "pipeline", "seed"])[list(METRICS)].mean()
    return means[counts == len(window.epochs)]


def paired_tests(frame: pd.DataFrame, early_epoch: int) -> pd.DataFrame:
    """Every test of :func:`questions` on the tidy run frame, one row each.

    Columns: ``family``, ``window``, ``metric``, ``row``, ``versus``, ``n``, ``mean_difference``,
    ``sd_difference``, ``t``, ``df``, ``p``, ``p_holm`` (Holm over the family), ``better``
    (seeds on the row's better side), ``signed_rank_p``, ``ci95_low`` and ``ci95_high`` (the
    95% t-interval of the mean difference); comparisons with fewer than 2 shared
    seeds are left out.
    """
    rows = sorted(
        set(zip(frame["variant"], frame["pipeline"], strict=True)), key=lambda r: row_rank(*r)
    )
    last = int(frame.groupby("run")["epoch"].max().min())
    cache: dict[Window, pd.DataFrame] = {}
    out = []
    for family, window, row, other in questions(rows, last, min(early_epoch, last)):
        if window not in cache:
            cache[window] = window_means(frame, window)
        means = cache[window]
        for metric, (_, sign) in METRICS.items():
            both = pd.concat(
                [means.loc[row, metric], means.loc[other, metric]], axis=1, join="inner"
            )
            if len(both) < 2:
                continue
            test = paired_test(both.iloc[:, 0], both.iloc[:, 1], sign)
            out.append(_test_row(family, window, metric, row, other, test))
    table = pd.DataFrame(out)
    if not table.empty:
        table["p_holm"] = table.groupby("family")["p"].transform(
            lambda p: pd.Series(holm(p.tolist()), index=p.index)
        )
    return table


def _test_row(family: str, window: Window, metric: str, row, other, test: PairedTest) -> dict:
    return {
        "family": family,
        "window": window.label,
        "metric": metric,
        "row": row_label(*row),
        "versus": row_label(*other),
        "n": test.n,
        "mean_difference": test.mean,
        "sd_difference": test.sd,
        "t": test.t,
        "df": test.n - 1,
        "p": test.p,
        "p_holm": float("nan"),
        "better": test.better,
        "signed_rank_p": test.signed_rank_p,
        "ci95_low": test.ci_low,
        "ci95_high": test.ci_high,
    }
