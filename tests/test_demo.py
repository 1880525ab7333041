"""`python train.py --demo`: the README's first command must visibly learn (slow: minutes on a CPU)."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train  # noqa: E402
from vitpose.config import load_config  # noqa: E402
from vitpose.engine.checkpoint import load_checkpoint  # noqa: E402


@pytest.mark.slow
def test_demo_ap_rises_well_above_where_it_started(tmp_path):
    code = train.main(["--demo", "--work-dir", str(tmp_path), "--data-root", str(tmp_path / "data")])
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    aps = [r["AP"] for r in records if r.get("kind") == "eval"]
    assert len(aps) == load_config(train.DEMO_CONFIG).schedule.epochs  # validated after every epoch
    assert aps[-1] > 0.3, aps
    assert aps[-1] > aps[0] + 0.2, aps
    best = load_checkpoint(tmp_path / "best.pth")
    assert best["best_ap"] == pytest.approx(max(aps))
