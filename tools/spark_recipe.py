"""README's Spark recipe ("Many GPUs, many machines"), run end to end on a local Spark, against one process.

    pip install pyspark pandas pyarrow     # and a Java runtime (17 here)
    PYSPARK_PYTHON=$(which python) python tools/spark_recipe.py [--images 6]

Not a test: pyspark is a 430 MB package, so CI does not install it (the Dask recipe, README's Python
block, is tested in tests/test_shard.py). It writes random images and random ViTPose-S weights to a
scratch folder, runs `vitpose predict` in one process, then the recipe (`df.mapInPandas`: one
`Predictor` per partition, `coco_records` per image) on `local[2]`, and prints how the two compare.
Exit status 1 when the records differ (another count, or keypoints more than 1e-4 px apart).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np


def poses_of(weights: str):
    """The function `mapInPandas` calls on each partition: an iterator of pandas frames with `path`."""

    def run(batches):
        import pandas as pd

        import vitpose
        from vitpose.inference.pipeline import coco_records

        predictor = vitpose.Predictor.from_pretrained(weights, detector="full-frame", device="cpu", precision="fp32",
                                                      batch_size=1)
        for batch in batches:
            rows = [json.dumps(record) for path in batch["path"]
                    for record in coco_records(predictor(cv2.imread(path)[:, :, ::-1]), file_name=Path(path).name)[0]]
            yield pd.DataFrame({"record": rows})
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=6)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_shard import scratch_images_and_weights

    work = scratch_images_and_weights("spark-recipe-", args.images, suffix=".png")
    subprocess.run([sys.executable, "-m", "vitpose", "predict", str(work / "images"), "--model",
                    str(work / "model.safetensors"), "--detector", "full-frame", "--device", "cpu", "--precision", "fp32",
                    "--batch-images", "1", "--batch-size", "1", "--json", str(work / "one.jsonl")], check=True,
                   capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    # One thread, as PySpark gives each Python worker (OMP_NUM_THREADS = spark.task.cpus): another thread
    # count sums the matrix products in another order (keypoints ~1e-3 px apart), not what is compared here.
    one = {r["file_name"]: r for r in map(json.loads, (work / "one.jsonl").read_text().splitlines())}

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    try:
        paths = spark.createDataFrame([(str(p),) for p in sorted((work / "images").glob("*.png"))], ["path"])
        rows = paths.repartition(2).mapInPandas(poses_of(str(work / "model.safetensors")), "record string").collect()
    finally:
        spark.stop()
    records = [json.loads(row.record) for row in rows]
    differences = [float(np.abs(np.subtract(r["keypoints"], one[r["file_name"]]["keypoints"])).max()) for r in records]
    same = sorted(r["file_name"] for r in records) == sorted(one) and max(differences, default=0.0) <= 1e-4
    print(f"Spark (local[2], 2 partitions): {len(records)} records; one process: {len(one)}; max keypoint "
          f"difference {max(differences, default=0.0):.2g} px: {'the same' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
