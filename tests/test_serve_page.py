"""The page of `vitpose serve` in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) opens it on 127.0.0.1, uploads a synthetic image, and the
drawn result and the keypoint table are checked against the API's JSON for the same image.

- The table holds every keypoint of every person, with x, y and score equal to the records of
  `POST /v1/predict` (the page keeps the numbers it got in data attributes: compared exactly).
- The canvas is the image's size, and at each drawn keypoint its pixel is the skeleton's colour of
  the keypoint drawn last over that spot (the page draws limbs, then points, person by person).
- "Download JSON" saves the records of the answer.
- The screenshot is kept as a test artefact (in the test's folder; `VITPOSE_PAGE_SCREENSHOT=path`
  saves it there too: docs/images/serve_page.png is one).

Where the browser cannot run, the test is skipped and says why; CI installs it (`.ci/run`).
"""

import json
import math
import os
import shutil
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from serve_helpers import multipart, start_server
from test_evaluate import tiny_model

import vitpose

pytest.importorskip("uvicorn", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
webdriver = pytest.importorskip("selenium.webdriver", reason='the browser test needs selenium: pip install -e ".[dev]"')

CHROMIUM = os.environ.get("VITPOSE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("VITPOSE_CHROMEDRIVER", "/usr/bin/chromedriver")
THRESHOLD = 0.1  # the random model's scores are low: draw most points


def _browser_missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (Path(path).is_file() or shutil.which(path)):
            return (f"{path} not found: install Debian's browser for this test (apt-get install -y chromium "
                    f"chromium-driver; .ci/run does) or point $VITPOSE_CHROMIUM / $VITPOSE_CHROMEDRIVER at it "
                    f"(missing: {package})")
    return None


pytestmark = pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("page")
    vitpose.save_weights(tiny_model(seed=11), root / "tiny.safetensors")
    server = start_server(["--model", root / "tiny.safetensors", "--detector", "full-frame", "--device", "cpu",
                           "--precision", "fp32"], root)
    yield server
    assert server.stop() == 0


@pytest.fixture
def browser(tmp_path):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-proxy-server",
                 "--window-size=1200,760", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(tmp_path / "downloads"),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def synthetic_image(path: Path) -> np.ndarray:
    """A 320x240 picture with a stick figure on a gradient (small as a PNG, easy to see in the screenshot)."""
    yy, xx = np.mgrid[0:320, 0:240]
    image = np.stack([150 + xx // 4, 120 + yy // 6, np.full_like(xx, 90)], -1).astype(np.uint8)
    cv2.circle(image, (120, 60), 22, (60, 60, 200), -1)
    for a, b in (((120, 82), (120, 190)), ((120, 110), (70, 160)), ((120, 110), (170, 160)),
                 ((120, 190), (85, 290)), ((120, 190), (155, 290))):
        cv2.line(image, a, b, (40, 40, 40), 9)
    cv2.imwrite(str(path), image)
    return image


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"the page did not {what} within {timeout} s")


def expected_colours(records, colours, radius: float, size):
    """[(x pixel, y pixel, rgb)] where the canvas must show a keypoint's colour: the pixel under each
    drawn point's centre, coloured by the last point drawn over it; pixels near another point's
    edge (anti-aliased) are left out."""
    drawn = []  # (x, y, colour) in drawing order
    for record in records:
        kp = np.reshape(record["keypoints"], (-1, 3))
        for k, (x, y, s) in enumerate(kp):
            if s is not None and s >= THRESHOLD:
                drawn.append((x, y, tuple(colours[k])))
    checks = []
    for i, (x, y, colour) in enumerate(drawn):
        px, py = math.floor(x), math.floor(y)
        if not (0 <= px < size[0] and 0 <= py < size[1]):
            continue
        cx, cy = px + 0.5, py + 0.5
        want, clear = colour, True
        for x2, y2, colour2 in drawn[i + 1:]:
            d = math.hypot(cx - x2, cy - y2)
            if abs(d - radius) < 1.5:
                clear = False
            elif d < radius:
                want = colour2
        if clear:
            checks.append((px, py, want))
    return checks


def far_from_drawing(pixel, records, limbs, margin: float) -> bool:
    """Whether a pixel centre is more than `margin` from every drawn point and limb."""
    p = np.array(pixel, float) + 0.5
    for record in records:
        kp = np.reshape(record["keypoints"], (-1, 3))
        shown = [k for k in range(len(kp)) if kp[k, 2] is not None and kp[k, 2] >= THRESHOLD]
        segments = [(kp[k, :2], kp[k, :2]) for k in shown] + [(kp[a, :2], kp[b, :2]) for a, b in limbs
                                                              if a in shown and b in shown]
        for a, b in segments:
            a, b = np.asarray(a, float), np.asarray(b, float)
            t = np.clip(np.dot(p - a, b - a) / max(np.dot(b - a, b - a), 1e-12), 0, 1)
            if np.linalg.norm(p - (a + t * (b - a))) <= margin:
                return False
    return True


def test_page_draws_the_api_answer_and_lists_it(server, browser, tmp_path):
    image_path = tmp_path / "figure.png"
    image = synthetic_image(image_path)
    status, model = server.json("GET", "/v1/model")
    assert status == 200
    body, headers = multipart({"image": (image_path.name, image_path.read_bytes())})
    status, answer = server.json("POST", "/v1/predict", body, headers)
    assert status == 200 and len(answer["records"]) == 1, answer

    browser.get(f"http://127.0.0.1:{server.port}/?threshold={THRESHOLD}")
    wait_for(lambda: browser.find_element("id", "model").text.startswith(model["model"]), 30, "show the model")
    browser.find_element("id", "file").send_keys(str(image_path))
    state = wait_for(lambda: browser.find_element("tag name", "body").get_attribute("data-state") in ("done", "error")
                     and browser.find_element("tag name", "body").get_attribute("data-state"), 120, "show an answer")
    status_line = browser.find_element("id", "status").text
    assert state == "done", status_line
    assert "1 person," in status_line and model["model"] in status_line and "ms on the server" in status_line

    # the table: every keypoint, the API's numbers
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#keypoints tbody tr')).map(r => "
        "[r.dataset.person, r.dataset.keypoint, r.dataset.x, r.dataset.y, r.dataset.score, r.cells[1].textContent])")
    names = model["skeleton"]["keypoint_names"]
    want = np.reshape(answer["records"][0]["keypoints"], (-1, 3))
    assert len(rows) == len(names) == len(want)
    for (person, k, x, y, s, name), (wx, wy, ws) in zip(rows, want):
        assert person == "0" and names[int(k)] == name
        assert (float(x), float(y), float(s)) == (wx, wy, ws)

    # the canvas: the image's size, the keypoints in their colours where they were drawn
    size = browser.execute_script("const c = document.getElementById('canvas'); return [c.width, c.height]")
    assert size == [image.shape[1], image.shape[0]]
    radius = float(browser.find_element("id", "canvas").get_attribute("data-radius"))
    checks = expected_colours(answer["records"], model["skeleton"]["keypoint_colors"], radius, size)
    assert len(checks) >= 3, "too few keypoints drawn on the image to check"
    pixels = browser.execute_script(
        "const ctx = document.getElementById('canvas').getContext('2d');"
        "return arguments[0].map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));",
        [[x, y] for x, y, _ in checks])
    assert [tuple(p) for p in pixels] == [c for _, _, c in checks]
    # and the image is there where nothing is drawn (a corner away from every point and limb)
    corners = [(0, 0), (size[0] - 1, 0), (0, size[1] - 1), (size[0] - 1, size[1] - 1)]
    x, y = next(c for c in corners if far_from_drawing(c, answer["records"], model["skeleton"]["limbs"], radius + 8))
    corner = browser.execute_script("return Array.from(document.getElementById('canvas').getContext('2d')"
                                    ".getImageData(arguments[0], arguments[1], 1, 1).data.slice(0, 3))", x, y)
    assert corner == list(image[y, x, ::-1].astype(int))

    # Download JSON: the records of the answer
    browser.find_element("id", "download").click()
    downloaded = tmp_path / "downloads" / "figure.json"
    wait_for(downloaded.is_file, 30, "download the JSON")
    assert json.loads(wait_for(lambda: downloaded.read_text() or None, 10, "finish the download")) == answer["records"]

    shot = tmp_path / "serve_page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 1000
    if os.environ.get("VITPOSE_PAGE_SCREENSHOT"):
        shutil.copy(shot, os.environ["VITPOSE_PAGE_SCREENSHOT"])
