"""The ``runs`` fixture: real run folders for the viewer tests (see view_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from view_runs import bisect, make_eval, make_train, xss_policy


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("view-runs")
    before = make_eval(root / "before", bisect(lambda lo, hi: lo > 35))
    after = make_eval(root / "after", bisect(lambda lo, hi: hi < 5))
    xss = make_eval(root / "xss", xss_policy, seeds=[0])
    train = make_train(root / "train", before, after)
    return {"root": root, "before": before, "after": after, "xss": xss, "train": train}
