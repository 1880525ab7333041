"""Top-down prediction: boxes -> crops -> model -> keypoints, for images, videos and ONNX."""
