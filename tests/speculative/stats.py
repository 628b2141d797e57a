"""A two-sample chi-square test of token histograms (no scipy: the chi-square survival
function is the regularised upper incomplete gamma function, in torch)."""
from __future__ import annotations

from collections import Counter

import torch


def chi_square_p(a: Counter, b: Counter, min_expected: float = 5.0) -> float:
    """p-value that samples ``a`` and ``b`` come from one distribution (rare tokens pooled)."""
    total_a, total_b = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b))
    cells, rare = [], [0, 0]
    for key in keys:
        row = (a.get(key, 0), b.get(key, 0))
        expected = (row[0] + row[1]) * min(total_a, total_b) / (total_a + total_b)
        if expected < min_expected:
            rare[0] += row[0]
            rare[1] += row[1]
        else:
            cells.append(row)
    if sum(rare):
        cells.append(tuple(rare))
    if len(cells) < 2:
        return 1.0
    stat = 0.0
    n = total_a + total_b
    for x, y in cells:
        col = x + y
        for observed, total in ((x, total_a), (y, total_b)):
            expected = col * total / n
            stat += (observed - expected) ** 2 / expected
    dof = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
