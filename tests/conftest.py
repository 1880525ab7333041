"""Shared test plumbing: where the committed parity fixtures and the coco-mini data live.

Both are part of the repository (tests/fixtures/README.md, tests/data/coco-mini/README.md), so a
missing file is an error of the checkout, reported as a failure rather than a skip.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# `train.py` and `evaluate.py` (the standalone scripts several tests import) live at the repository
# root, which is on sys.path only under `python -m pytest` or PYTHONPATH; plain `pytest tests/x.py`
# must find them too, whichever file runs alone.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# What `precision="auto"` measures of this CPU (vitpose.device.cpu_bf16_speedup) is kept in a folder
# of the test run, never in the user's cache.
os.environ["VITPOSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="vitpose-test-cache-")
FIXTURES = TESTS / "fixtures"
COCO_MINI = TESTS / "data" / "coco-mini"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: MMPose 1.3.2 reference outputs made by tools/reference/make_fixtures.py."""
    assert (FIXTURES / "README.md").is_file(), f"the parity fixtures are missing from {FIXTURES}"
    return FIXTURES


@pytest.fixture(scope="session")
def coco_mini_dir() -> Path:
    """tests/data/coco-mini: 4 COCO val2017 images, their keypoint annotations and detections."""
    assert (COCO_MINI / "test_coco.json").is_file(), f"coco-mini is missing from {COCO_MINI}"
    return COCO_MINI


@pytest.fixture
def serve():
    """`vitpose serve`'s application in this process: serve(predictor, **settings) -> (app, service), on
    `vitpose.serve.app.Settings` (a stand-in model name); every service's batch thread closed after the test."""
    from vitpose.serve.app import Settings, build_app, open_service

    services = []

    def make(predictor, **settings):
        service = open_service(predictor, None, Settings(model_name="stand-in", **settings), max_wait=0.0)
        services.append(service)
        return build_app(service), service

    yield make
    for service in services:
        service.runner.close()
