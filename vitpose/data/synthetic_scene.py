"""One synthetic scene: stick-and-blob people on a varied background, and their COCO labels.

What is drawn
-------------
Each image holds 1-4 stick-and-blob people on a varied background (colour gradients, smooth
noise, or flat colour with random rectangles, circles and lines in muted colours):

- a filled torso quadrilateral (shoulders and hips), thick limbs (upper arm, forearm, thigh, shin)
  with a darker dot at every joint, and a round head on a neck;
- the 17 COCO joints with their usual meaning: nose, eyes and ears on the head, shoulders, elbows,
  wrists, hips, knees, ankles;
- varied poses: torso lean, head tilt and turn, arm and leg angles and bends inside human-ish
  limits, random foreshortening of limbs and of the body's width (a turned body);
- people of varied size, some truncated by the image border (keypoints outside the image get
  v=0 and coordinates (0, 0), as in COCO) and some covered by an occluder rectangle or by a person
  drawn later (keypoints inside the image but not visible get v=1);
- now and then one or two small people in the back, annotated as COCO annotates its small people:
  a box and no keypoints (num_keypoints 0), the instances loaders filter out and COCOeval ignores.

Figures are saturated, backgrounds are not, joints are marked, and most people are whole, large
and unoccluded: a small ViTPose learns the set in minutes on a CPU, while every code path a real
COCO file exercises (v=0/1/2, truncation, crowding, empty annotations, false-positive boxes) is hit.

Left and right
--------------
A person's left and right are told apart the way they are in photographs: by where the person
faces. A person seen from the front shows a face (eyes, nose) and has their left side on the
image's right; a person seen from behind shows the back of the head (hair colour, no face) and has
their left side on the image's left. Each person's two sides are drawn in two different colours
(so a wrist can be matched to its elbow and shoulder even when arms cross), but which side gets
which colour is random per person. The set is therefore mirror-consistent: mirroring an image and
swapping left/right labels gives an image from the same distribution. That is what horizontal-flip
augmentation and flip test assume of real data; a fixed "left limbs are red" rule would break both
(flip augmentation would teach contradictory labels and flip test would swap the wrists).

`synthesize_image(rng, width, height, max_people)` draws one scene from its random stream;
`vitpose.data.synthetic` writes scenes as a COCO keypoint set.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import cv2
import numpy as np

from vitpose.coco_meta import KEYPOINT_NAMES, NUM_KEYPOINTS

__all__ = ["Person", "SyntheticImage", "synthesize_image"]

# Scene statistics. Chosen so that a small model learns the set in minutes: most people are
# whole, large and unoccluded; the hard cases are there but rare.
PEOPLE_PER_IMAGE_P = (0.4, 0.3, 0.18, 0.12)  # P(1), P(2), P(3), P(4) people (capped by max_people)
P_BACK_VIEW = 0.2  # seen from behind: no face, left side on the image's left
P_TRUNCATED = 0.12  # placed partly outside the image
P_OCCLUDER = 0.3  # per image: one rectangle drawn over a person
# Per image: small people in the back, annotated like COCO's small people (no keypoints
# labelled, num_keypoints 0) -- the instances a loader filters out and COCOeval ignores.
P_SMALL_UNLABELLED = 0.2

# Body proportions as fractions of the figure's height unit L (head top to ankles ~ 0.92 L).
TORSO = 0.30  # shoulder midpoint to hip midpoint
SHOULDER_HALF_WIDTH = 0.11
HIP_HALF_WIDTH = 0.075
NECK = 0.10  # shoulder midpoint to head centre
HEAD_RADIUS = 0.065
UPPER_ARM, FOREARM = 0.16, 0.14
THIGH, SHIN = 0.23, 0.22

# COCO keypoint indices, by name, for readable pose code.
K = {name: i for i, name in enumerate(KEYPOINT_NAMES)}

@dataclass
class Person:
    keypoints: np.ndarray  # (17, 2) float64 image coordinates, before visibility is applied
    height: float  # L, pixels
    facing_front: bool
    colors: dict  # part name -> BGR tuple
    labelled: bool = True  # False: annotated with num_keypoints 0, like COCO's small people


@dataclass
class SyntheticImage:
    image: np.ndarray  # (H, W, 3) uint8 BGR
    background: np.ndarray  # the same image before people and occluders were drawn
    keypoints: np.ndarray  # (P, 17, 3) float64 COCO (x, y, v); v=0 rows are (0, 0, 0)
    bboxes: np.ndarray  # (P, 4) float64 xywh, clipped to the image
    facing_front: np.ndarray  # (P,) bool
    people: list  # the Person records drawn, in drawing order (tests read their colours)


# ---------------------------------------------------------------------------------------------
# Random colours


def _hsv_to_bgr(h: float, s: float, v: float) -> tuple[int, int, int]:
    """h in degrees [0, 360), s and v in [0, 1] -> an OpenCV BGR colour tuple."""
    hsv = np.array([[[h / 2.0, s * 255.0, v * 255.0]]], dtype=np.float32).clip(0, [179, 255, 255])
    bgr = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2BGR)[0, 0]
    return tuple(int(c) for c in bgr)


def _muted_color(rng: np.random.Generator) -> tuple[int, int, int]:
    # Backgrounds stay unsaturated so that the saturated figures stand out.
    return _hsv_to_bgr(rng.uniform(0, 360), rng.uniform(0.0, 0.35), rng.uniform(0.15, 0.95))


def _person_colors(rng: np.random.Generator, facing_front: bool) -> dict:
    side_a = rng.uniform(0, 360)
    side_b = (side_a + rng.uniform(70, 290)) % 360  # the two sides are far apart in hue
    torso = rng.uniform(0, 360)
    sides = [_hsv_to_bgr(side_a, rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0)),
             _hsv_to_bgr(side_b, rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0))]
    if rng.random() < 0.5:  # which side gets which colour carries no left/right information
        sides.reverse()
    skin = _hsv_to_bgr(rng.uniform(15, 35), rng.uniform(0.3, 0.6), rng.uniform(0.55, 0.95))
    hair = _hsv_to_bgr(rng.uniform(0, 40), rng.uniform(0.3, 0.8), rng.uniform(0.08, 0.3))
    return {
        "left": sides[0],
        "right": sides[1],
        "torso": _hsv_to_bgr(torso, rng.uniform(0.5, 0.9), rng.uniform(0.45, 0.85)),
        "skin": skin,
        "head": skin if facing_front else hair,
        "eye": (20, 20, 20),
        "nose": _hsv_to_bgr(rng.uniform(0, 15), 0.7, 0.6),
    }


# ---------------------------------------------------------------------------------------------
# Backgrounds


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    # Smooth backgrounds are made on a coarse grid and upsampled: cheap, and just as varied.
    kind = rng.integers(3)
    if kind == 0:  # linear gradient between two colours at a random angle
        c0, c1 = np.array(_muted_color(rng), np.float32), np.array(_muted_color(rng), np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        gw, gh = width // 8 + 1, height // 8 + 1
        t = np.arange(gw)[None, :] * np.cos(angle) + np.arange(gh)[:, None] * np.sin(angle)
        t = ((t - t.min()) / max(float(t.max() - t.min()), 1.0)).astype(np.float32)
        coarse = c0 + (c1 - c0) * t[..., None]
        image = cv2.resize(coarse.astype(np.uint8), (width, height), interpolation=cv2.INTER_LINEAR)
    elif kind == 1:  # smooth noise: a coarse random grid upsampled
        cell = int(rng.integers(20, 64))
        coarse = rng.uniform(0, 1, (height // cell + 2, width // cell + 2, 3))
        gray = coarse.mean(axis=2, keepdims=True)
        coarse = gray + 0.25 * (coarse - gray)  # keep it unsaturated
        lo, hi = sorted(rng.uniform(20, 235, 2))
        coarse = np.clip(lo + (hi - lo + 20) * coarse, 0, 255).astype(np.uint8)
        image = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    else:  # flat colour with random muted shapes
        image = np.empty((height, width, 3), np.uint8)
        image[:] = _muted_color(rng)
        for _ in range(int(rng.integers(3, 10))):
            color = _muted_color(rng)
            x, y = int(rng.integers(width)), int(rng.integers(height))
            size = int(rng.integers(8, max(9, min(width, height) // 3)))
            shape = rng.integers(3)
            if shape == 0:
                cv2.rectangle(image, (x, y), (x + size, y + int(size * rng.uniform(0.3, 2))), color, -1)
            elif shape == 1:
                cv2.circle(image, (x, y), size // 2, color, -1, cv2.LINE_AA)
            else:
                end = (int(rng.integers(width)), int(rng.integers(height)))
                cv2.line(image, (x, y), end, color, int(rng.integers(1, 4)), cv2.LINE_AA)
    # Sensor-like pixel noise: uniform in [-a, a], added with saturation in one pass.
    amplitude = float(rng.uniform(0, 8))
    noise = np.frombuffer(rng.bytes(image.size), np.uint8).reshape(image.shape)
    return cv2.addWeighted(image, 1.0, noise, amplitude / 127.5, -amplitude)


# ---------------------------------------------------------------------------------------------
# Poses


def _rotate(v: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def _sample_pose(rng: np.random.Generator, height: float, facing_front: bool) -> np.ndarray:
    """17 joints of one person with the hip midpoint at the origin (x right, y down)."""
    L = height
    kp = np.zeros((NUM_KEYPOINTS, 2))
    lean = rng.normal(0, np.radians(8))
    if rng.random() < 0.1:
        lean = rng.uniform(-1, 1) * np.radians(45)  # bending over
    up = np.array([np.sin(lean), -np.cos(lean)])
    # Unit vector towards the person's left: the image's right when seen from the front.
    to_left = np.array([np.cos(lean), np.sin(lean)]) * (1.0 if facing_front else -1.0)
    width = rng.uniform(0.55, 1.0)  # a body turned away from the camera looks narrower

    neck = up * TORSO * L
    sides = {"left": 1.0, "right": -1.0}
    for side, sign in sides.items():
        kp[K[f"{side}_shoulder"]] = neck + sign * to_left * SHOULDER_HALF_WIDTH * width * L
        kp[K[f"{side}_hip"]] = sign * to_left * HIP_HALF_WIDTH * width * L

    # Head: tilted and turned a little; the face features move sideways with the turn.
    tilt = rng.normal(0, np.radians(10))
    head_up = _rotate(up, tilt)
    head_left = _rotate(to_left, tilt)
    head = neck + head_up * NECK * L
    r = HEAD_RADIUS * L
    turn = rng.uniform(-0.45, 0.45)  # fraction of the head radius the face shifts towards the left
    face = head + head_left * turn * r
    kp[K["nose"]] = face - head_up * 0.15 * r
    for side, sign in sides.items():
        kp[K[f"{side}_eye"]] = face + head_up * 0.3 * r + sign * head_left * 0.38 * r
        kp[K[f"{side}_ear"]] = head + sign * head_left * 0.95 * r + head_left * 0.15 * turn * r

    down = -up
    for side, sign in sides.items():
        outward = sign * to_left
        # Arms: upper arm from hanging (0) through raised sideways (90) to overhead (~160 deg);
        # slightly negative angles cross in front of the body. The elbow bends either way.
        raise_ = np.radians(rng.uniform(-20, 165))
        upper = np.cos(raise_) * down + np.sin(raise_) * outward
        bend = np.radians(rng.choice([-1, 1]) * abs(rng.normal(0, 50)))
        bend = float(np.clip(bend, -np.radians(150), np.radians(150)))
        fore = _rotate(upper, bend)
        shoulder = kp[K[f"{side}_shoulder"]]
        elbow = shoulder + upper * UPPER_ARM * L * rng.uniform(0.7, 1.0)
        kp[K[f"{side}_elbow"]] = elbow
        kp[K[f"{side}_wrist"]] = elbow + fore * FOREARM * L * rng.uniform(0.7, 1.0)
        # Legs: mostly standing or striding; sometimes kicked out sideways. Knees bend less.
        spread = np.radians(rng.uniform(-12, 35) if rng.random() < 0.85 else rng.uniform(35, 80))
        thigh = np.cos(spread) * down + np.sin(spread) * outward
        knee_bend = np.radians(rng.choice([-1, 1]) * min(abs(rng.normal(0, 30)), 110))
        shin = _rotate(thigh, knee_bend)
        hip = kp[K[f"{side}_hip"]]
        knee = hip + thigh * THIGH * L * rng.uniform(0.75, 1.0)
        kp[K[f"{side}_knee"]] = knee
        kp[K[f"{side}_ankle"]] = knee + shin * SHIN * L * rng.uniform(0.75, 1.0)
    return kp


def _figure_extent(kp: np.ndarray, height: float) -> np.ndarray:
    """x0, y0, x1, y1 of everything drawn for a person: joints, limb thickness and the head."""
    head = (kp[K["left_ear"]] + kp[K["right_ear"]]) / 2
    r = HEAD_RADIUS * height
    margin = _limb_thickness(height) / 2 + 1
    x0, y0 = np.minimum(kp.min(0) - margin, head - r)
    x1, y1 = np.maximum(kp.max(0) + margin, head + r)
    return np.array([x0, y0, x1, y1])


def _limb_thickness(height: float) -> int:
    return max(2, round(0.05 * height))


# ---------------------------------------------------------------------------------------------
# Drawing. Points go to OpenCV with 4 fractional bits, so figures sit at sub-pixel precision.

_SHIFT = 4
_ONE = 1 << _SHIFT


def _pt(p: np.ndarray) -> tuple[int, int]:
    return round(p[0] * _ONE), round(p[1] * _ONE)


def _draw_person(image: np.ndarray, owner: np.ndarray, person: Person, label: int,
                 rng: np.random.Generator) -> None:
    """Draws `person` into `image` and writes `label` into `owner` wherever it painted."""
    kp, L, colors = person.keypoints, person.height, person.colors
    thick = _limb_thickness(L)

    def line(a, b, color, width):
        cv2.line(image, _pt(a), _pt(b), color, width, cv2.LINE_AA, _SHIFT)
        cv2.line(owner, _pt(a), _pt(b), label, width, cv2.LINE_8, _SHIFT)

    def disk(c, radius, color):
        cv2.circle(image, _pt(c), round(radius * _ONE), color, -1, cv2.LINE_AA, _SHIFT)
        cv2.circle(owner, _pt(c), round(radius * _ONE), label, -1, cv2.LINE_8, _SHIFT)

    def limb_chain(side, names):
        for a, b in itertools.pairwise(names):
            line(kp[K[f"{side}_{a}"]], kp[K[f"{side}_{b}"]], colors[side], thick)

    sides = ["left", "right"]
    rng.shuffle(sides)  # which leg, and which arm, is drawn on top
    for side in sides:
        limb_chain(side, ["hip", "knee", "ankle"])
    torso = np.stack([kp[K["left_shoulder"]], kp[K["right_shoulder"]], kp[K["right_hip"]], kp[K["left_hip"]]])
    pts = np.array([_pt(p) for p in torso], np.int32)
    cv2.fillPoly(image, [pts], colors["torso"], cv2.LINE_AA, _SHIFT)
    cv2.fillPoly(owner, [pts], label, cv2.LINE_8, _SHIFT)
    cv2.polylines(image, [pts], True, colors["torso"], thick, cv2.LINE_AA, _SHIFT)
    cv2.polylines(owner, [pts], True, label, thick, cv2.LINE_8, _SHIFT)

    # Neck and head.
    head = (kp[K["left_ear"]] + kp[K["right_ear"]]) / 2
    neck = (kp[K["left_shoulder"]] + kp[K["right_shoulder"]]) / 2
    r = HEAD_RADIUS * L
    line(neck, head, colors["skin"], max(2, round(0.8 * r)))
    disk(head, r, colors["head"])
    ear_r = max(1.2, 0.22 * r)
    for side in ["left", "right"]:
        disk(kp[K[f"{side}_ear"]], ear_r, colors["skin"])
    if person.facing_front:
        for side in ["left", "right"]:
            disk(kp[K[f"{side}_eye"]], max(1.0, 0.14 * r), colors["eye"])
        disk(kp[K["nose"]], max(1.0, 0.16 * r), colors["nose"])

    for side in sides:
        limb_chain(side, ["shoulder", "elbow", "wrist"])
    # A darker dot on each body joint marks where it is.
    dot = max(1.0, 0.35 * thick)
    for side in ["left", "right"]:
        dark = tuple(int(c * 0.45) for c in colors[side])
        for joint in ["shoulder", "elbow", "wrist", "hip", "knee", "ankle"]:
            disk(kp[K[f"{side}_{joint}"]], dot, dark)


def synthesize_image(rng: np.random.Generator, width: int, height: int, max_people: int) -> SyntheticImage:
    """One synthetic scene drawn from `rng` (see `image_rng`): the image, its background and
    the labels of the people drawn (tests check the pixels against the labels)."""
    background = _background(rng, width, height)
    image = background.copy()
    owner = np.zeros((height, width), np.uint8)  # 0 background, i+1 person i, 255 occluder

    p = np.array(PEOPLE_PER_IMAGE_P[:max_people])
    num_people = int(rng.choice(len(p), p=p / p.sum())) + 1
    people, extents = [], []
    if rng.random() < P_SMALL_UNLABELLED:
        for _ in range(int(rng.integers(1, 3))):
            size = height * rng.uniform(0.12, 0.22)
            front = rng.random() >= P_BACK_VIEW
            pose = _sample_pose(rng, size, front)
            x0, y0, x1, y1 = _figure_extent(pose, size)
            offset = rng.uniform([-x0, -y0], [max(-x0, width - x1), max(-y0, height - y1)])
            people.append(Person(pose + offset, size, front, _person_colors(rng, front), labelled=False))
    for _ in range(num_people):
        size = height * rng.uniform(0.5, 1.05) * (1.0 - 0.12 * (num_people - 1))
        front = rng.random() >= P_BACK_VIEW
        pose = _sample_pose(rng, size, front)
        x0, y0, x1, y1 = _figure_extent(pose, size)
        truncated = rng.random() < P_TRUNCATED
        # Choose an offset that keeps the figure inside the image (or lets it stick out when
        # truncated), and avoid stacking people on top of one another.
        for _attempt in range(10):
            slack_x, slack_y = (0.45 * (x1 - x0), 0.45 * (y1 - y0)) if truncated else (0.0, 0.0)
            lo = np.array([-x0 - slack_x, -y0 - slack_y])
            hi = np.array([width - x1 + slack_x, height - y1 + slack_y])
            hi = np.maximum(hi, lo)  # a figure larger than the image gets centred-ish
            offset = rng.uniform(lo, hi + 1e-6)
            box = np.array([x0, y0, x1, y1]) + np.tile(offset, 2)
            if all(_iou_xyxy(box, other) < 0.3 for other in extents):
                break
        extents.append(box)
        colors = _person_colors(rng, front)
        people.append(Person(pose + offset, size, front, colors))

    for i, person in enumerate(people):
        _draw_person(image, owner, person, i + 1, rng)

    if rng.random() < P_OCCLUDER:
        target = people[-num_people + int(rng.integers(num_people))]  # one of the labelled people
        center = target.keypoints[int(rng.integers(NUM_KEYPOINTS))] + rng.normal(0, 0.05 * target.height, 2)
        half = target.height * rng.uniform(0.05, 0.15, 2)
        p0, p1 = center - half, center + half
        color = _muted_color(rng)
        cv2.rectangle(image, _pt(p0), _pt(p1), color, -1, cv2.LINE_AA, _SHIFT)
        cv2.rectangle(owner, _pt(p0), _pt(p1), 255, -1, cv2.LINE_8, _SHIFT)

    keypoints = np.zeros((len(people), NUM_KEYPOINTS, 3))
    bboxes = np.zeros((len(people), 4))
    for i, person in enumerate(people):
        kp = person.keypoints
        inside = (kp[:, 0] >= 0) & (kp[:, 0] <= width - 1) & (kp[:, 1] >= 0) & (kp[:, 1] <= height - 1)
        xi = np.clip(np.round(kp[:, 0]).astype(int), 0, width - 1)
        yi = np.clip(np.round(kp[:, 1]).astype(int), 0, height - 1)
        seen = owner[yi, xi] == i + 1
        if not person.facing_front:  # the face is on the far side of the head
            seen[[K["nose"], K["left_eye"], K["right_eye"]]] = False
        v = np.where(inside, np.where(seen, 2, 1), 0) if person.labelled else np.zeros(NUM_KEYPOINTS)
        inside &= v > 0
        keypoints[i, :, :2] = np.where(inside[:, None], kp, 0.0)
        keypoints[i, :, 2] = v
        x0, y0, x1, y1 = _figure_extent(kp, person.height)
        x0, x1 = np.clip([x0, x1], 0, width)
        y0, y1 = np.clip([y0, y1], 0, height)
        bboxes[i] = [x0, y0, x1 - x0, y1 - y0]
    facing = np.array([p.facing_front for p in people])
    return SyntheticImage(image, background, keypoints, bboxes, facing, people)


def _iou_xyxy(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0

