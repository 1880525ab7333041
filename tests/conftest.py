"""Shared test plumbing: where ../shared lives, and skips with a reason when it is absent."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("VITPOSE_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures"
COCO_MINI = SHARED / "data" / "coco-mini"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"MMPose reference fixtures not found at {FIXTURES} (set VITPOSE_SHARED)")
    return FIXTURES


@pytest.fixture(scope="session")
def coco_mini_dir() -> Path:
    if not (COCO_MINI / "test_coco.json").is_file():
        pytest.skip(f"coco-mini not found at {COCO_MINI} (set VITPOSE_SHARED)")
    return COCO_MINI
