"""Left and right from keypoint names: which keypoint mirrors which, and the colours of each side.

Flip pairs from names: a keypoint whose name has a side token (left/right, Left/Right, LEFT/RIGHT,
l/r, L/R, as a word of the name: `left_eye`, `eye_l`, `l_eye`, `LeftHand`, `hand-right`) pairs with
the keypoint named with the other side; a side-named keypoint with no such twin is an error that
names it (give `flip_pairs` explicitly then). Keypoints without a side token map to themselves.
The colours follow MMPose's convention (RGB): left green, right orange, the rest blue.
"""

from __future__ import annotations

import re

from .errors import DataError

__all__ = ["CENTER_COLOR", "LEFT_COLOR", "RIGHT_COLOR", "infer_flip_indices", "link_color", "side_color", "side_of",
           "twin_name"]

# MMPose's colour convention (RGB): left green, right orange, the rest blue.
LEFT_COLOR, RIGHT_COLOR, CENTER_COLOR = (0, 255, 0), (255, 128, 0), (51, 153, 255)

_SIDE_SWAP = {"left": "right", "right": "left", "Left": "Right", "Right": "Left", "LEFT": "RIGHT",
              "RIGHT": "LEFT", "l": "r", "r": "l", "L": "R", "R": "L"}
# A side token is a word of the name: bounded by the name's ends, separators (_ - . space),
# digits, or a camel-case change ("LeftHand", "handLeft"). A lower-case token must not touch
# a letter before it or a lower-case letter after it; a capitalised one may follow a lower-case
# letter (camel case) but not an upper-case one, and must not run on into lower-case letters.
_SIDE_TOKEN = re.compile(
    r"(?<![A-Za-z])(left|right|l|r)(?![a-z])"
    r"|(?<![A-Z])(Left|Right|LEFT|RIGHT|L|R)(?![a-z])"
)


def side_of(name: str) -> str | None:
    """"left", "right" or None: the side a keypoint name's first side token names."""
    m = _SIDE_TOKEN.search(name)
    if not m:
        return None
    token = (m.group(1) or m.group(2)).lower()
    return "left" if token in ("left", "l") else "right"


def twin_name(name: str) -> str | None:
    """The name with every side token swapped (left_eye -> right_eye), or None without one."""
    if not _SIDE_TOKEN.search(name):
        return None
    return _SIDE_TOKEN.sub(lambda m: _SIDE_SWAP[m.group(0)], name)


def side_color(name: str) -> tuple[int, int, int]:
    return {"left": LEFT_COLOR, "right": RIGHT_COLOR}.get(side_of(name), CENTER_COLOR)


def link_color(names, a: int, b: int) -> tuple[int, int, int]:
    sa, sb = side_of(names[a]), side_of(names[b])
    return side_color(names[a]) if sa == sb else CENTER_COLOR


def infer_flip_indices(names, source: str = "<names>", how_to_fix: str = "") -> tuple[int, ...]:
    """flip_indices from left/right twins in the names (see the module docstring).

    Raises DataError naming the first side-named keypoint with no twin.
    """
    position = {n: i for i, n in enumerate(names)}
    flip = []
    for i, name in enumerate(names):
        twin = twin_name(name)
        if twin is None:
            flip.append(i)
        elif twin in position:
            flip.append(position[twin])
        else:
            raise DataError(
                f"keypoint {name!r} (index {i}) names a side but there is no keypoint {twin!r} to mirror it "
                f"to; give the flip pairs explicitly{how_to_fix}", file=source, field="flip_pairs")
    return tuple(flip)
