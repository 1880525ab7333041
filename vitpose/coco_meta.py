"""COCO-17 keypoint facts shared by every layer (no imports, no behaviour).

Order and values follow MMPose's `configs/_base_/datasets/coco.py` and the COCO annotation
files; docs/data.md §8 gives the sources. They are the built-in skeleton `vitpose.data.dataset_info(
"coco")` written out for the lowest layer (models and evaluation default to them);
tests/test_dataset_info.py checks that the two agree.
"""

KEYPOINT_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear",
    "left_shoulder", "right_shoulder", "left_elbow", "right_elbow",
    "left_wrist", "right_wrist", "left_hip", "right_hip",
    "left_knee", "right_knee", "left_ankle", "right_ankle",
)
NUM_KEYPOINTS = len(KEYPOINT_NAMES)

# Horizontal flip swaps every left joint with its right twin.
FLIP_INDICES = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)

# Per-keypoint OKS sigmas (COCO keypoint evaluation).
SIGMAS = (
    0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072,
    0.062, 0.062, 0.107, 0.107, 0.087, 0.087, 0.089, 0.089,
)

# Half-body augmentation splits the body here (MMPose's `type='upper'/'lower'`).
UPPER_BODY_IDS = tuple(range(0, 11))
LOWER_BODY_IDS = tuple(range(11, 17))

# Limbs for drawing, 0-based (the COCO annotation file's `skeleton`, which is 1-based).
SKELETON = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7),
    (6, 8), (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
)

# Model input normalisation on the 0-255 scale, RGB order.
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)
PERSON_CATEGORY_ID = 1  # COCO's "person" category: the only one top-down person datasets keep

# COCO's 80 object detection classes (instances_val2017.json's category names, in id order): what
# a torchvision COCO detector can find, and what a skeleton's `detector_classes` may name.
# tests/test_detect.py checks them against torchvision's label list.
DETECTION_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear",
    "hair drier", "toothbrush",
)
