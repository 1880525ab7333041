"""`vitpose serve`: poses over HTTP, with request batching, a web page and a Label Studio ML backend.

    vitpose serve                                     # http://127.0.0.1:8000/ : the page
    vitpose serve --model vitpose-s --max-batch 16 --max-wait-ms 10
    vitpose serve --model mine.onnx --detector full-frame --token "$TOKEN" --host 0.0.0.0
    curl -F image=@photo.jpg http://127.0.0.1:8000/v1/predict          # the records of `predict --json`
    curl --data-binary @photo.jpg "http://127.0.0.1:8000/v1/predict?format=labelstudio"

The model opens once through the one door every command takes (`vitpose.open_predictor`: a
published name, an HF repo id, a weights file, an exported .onnx file or OpenVINO IR); a bad
--detector, --precision or --device, or a model that cannot be found, is refused at start-up in one
line (exit 2). Concurrent requests share forward passes: the crops of several images go through the
network together, up to --max-batch crops, waiting at most --max-wait-ms for more
(vitpose.serve.batching). Endpoints, limits and errors: vitpose/serve/app.py; Label Studio
(Settings > Model > Connect model, URL of this server): vitpose/serve/labelstudio.py.

Slow and greedy clients cannot starve the others: a body that goes --body-timeout seconds (10)
without a byte, or slower than 16 KB/s after that long, is given up (408, connection closed, its
--max-in-flight slot freed); at most
--max-pixels-in-flight pixels (default twice the pixel limit: 300 megapixels, about 2 GB of
decoding memory at ~6 bytes a pixel) are decoded or answered at once, counted from the images'
headers (a request beyond it waits up to 2 s, then gets 503 with Retry-After; Label Studio's tasks
are decoded one at a time within it); a request has at most --max-boxes boxes (1000; more: 413), and
a request's boxes go through the network --max-batch at a time, taking turns with the other
requests, so none waits past its --timeout behind another's; a request that gave up (504, or its
client gone) is not computed further. /v1/health says "saturated" when --max-in-flight or the pixel
budget is used up.

It listens on loopback unless --host says otherwise, which needs --token. Label Studio: docs/labelstudio.md
(the labelling config of the model: GET /v1/labelstudio-config, printed at start-up). SIGTERM stops
accepting connections, answers the requests in flight and exits 0; Ctrl-C does the same and exits 130.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

from vitpose.cli.options import (
    DEFAULT_MODEL,
    add_mark_by_argument,
    add_model_arguments,
    check_numbers,
    model_options,
    open_model,
)
from vitpose.errors import UsageError, require_extra

__all__ = ["DEFAULT_MODEL", "ServeError", "TOKEN_ENV", "add_parser", "run"]

TOKEN_ENV = "VITPOSE_SERVE_TOKEN"

# `vitpose serve`'s command-line errors are the one usage error of every command (the old name stays)
ServeError = UsageError


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("serve", help="poses over HTTP: API, web page, Label Studio ML backend",
                              shared=("--config", "--device", "--debug"), description=doc[0],
                              epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p, detector_default="default", batch_size=False)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed; default: %(default)s)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="crops per forward pass, gathered from concurrent requests (default: 8 on a CPU, 32 on a GPU)")
    p.add_argument("--max-wait-ms", type=float, default=10.0,
                   help="how long a batch waits for more requests after its first (default: %(default)s)")
    p.add_argument("--token", default=None,
                   help=f"require 'Authorization: Bearer TOKEN' (default: ${TOKEN_ENV} if set; none)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may wait for its poses (default: %(default)s)")
    p.add_argument("--max-in-flight", type=int, default=64,
                   help="requests answered at once; more get 503 (bounds the memory they hold; default: %(default)s)")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="largest request body in MB (default: %(default)s)")
    p.add_argument("--body-timeout", type=float, default=10.0,
                   help="seconds a request body may go without a byte arriving; then 408 and the connection is "
                        "closed (default: %(default)s)")
    p.add_argument("--max-pixels-in-flight", type=int, default=None,
                   help="pixels of the images decoded or answered at once, read from their headers; beyond it a "
                        "request waits up to 2 s, then 503 with Retry-After (default: twice the pixel limit, "
                        "300000000; 0 = no limit)")
    p.add_argument("--max-boxes", type=int, default=1000,
                   help="boxes one request may send; more get 413 (default: %(default)s)")
    p.add_argument("--max-pixels", type=int, default=None,
                   help="largest image in pixels, read from its header before decoding (default: $VITPOSE_MAX_PIXELS "
                        "or 150000000)")
    p.add_argument("--labelstudio-config", action="store_true",
                   help="print the Label Studio labelling config of the model's keypoints and exit (no server; "
                        "docs/labelstudio.md)")
    p.add_argument("--image-dir", type=Path, default=None,
                   help="Label Studio: the folder of the tasks' images (local files or uploads), read by file name")
    p.add_argument("--labelstudio-url", default=None,
                   help="Label Studio: fetch task images from this server (token: $LABEL_STUDIO_API_KEY or /setup's)")
    p.add_argument("--mark-below", type=float, default=0.3,
                   help="labelstudio/cvat answers: keypoints scored below this are marked (default: %(default)s)")
    add_mark_by_argument(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.set_defaults(run=run)
    return p


def _check_flags(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be in 0..65535, got {args.port}")
    check_numbers(("--max-batch", args.max_batch, 1, None), ("--max-wait-ms", args.max_wait_ms, 0, 10_000),
                  ("--max-in-flight", args.max_in_flight, 1, None), ("--max-boxes", args.max_boxes, 1, None),
                  ("--max-pixels-in-flight", args.max_pixels_in_flight, 0, None, " (0 = no limit)"),
                  ("--max-pixels", args.max_pixels, 0, None, " (0 = no limit)"), ("--mark-below", args.mark_below, 0, 1))
    for flag, seconds in (("--timeout", args.timeout), ("--body-timeout", args.body_timeout),
                          ("--max-body-mb", args.max_body_mb)):
        if not seconds > 0:
            raise ServeError(f"{flag} must be > 0, got {seconds}")
    if args.image_dir is not None and not args.image_dir.is_dir():
        raise ServeError(f"--image-dir: not a folder: {args.image_dir}")
    if args.token is not None and not args.token.strip():
        raise ServeError("--token is empty: give a secret, or leave the flag out")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def describe(predictor, model: str):
    """(the model's `ModelSpec` or None, the details /v1/model reports: runtime, and device,
    precision and flip test) of a predictor `open_model` opened for `model`."""
    from vitpose.inference.onnx import is_exported, is_openvino

    if is_exported(model):
        if predictor.skeleton is None:
            raise UsageError(f"--model {model}: a graph of {predictor.num_keypoints} keypoints that records no "
                             f"skeleton; the server needs the keypoints' names (export it with this version, or "
                             f"serve the weights file)")
        runtime = "openvino" if is_openvino(model) else "onnxruntime"
        return getattr(predictor, "spec", None), {"runtime": runtime, "flip_test": predictor.flip_test}
    precision = {None: "fp32"}.get(predictor.amp_dtype, str(predictor.amp_dtype).replace("torch.", ""))
    return getattr(predictor.model, "spec", None), {
        "runtime": "torch", "device": str(predictor.device), "precision": precision, "flip_test": predictor.flip_test}


def run(args) -> int:
    _check_flags(args)
    options = model_options(args, batch_size=args.max_batch)
    if args.labelstudio_config:  # the labelling config alone: what a Label Studio project is created with
        from vitpose.serve.labelstudio import labelling_config

        predictor = open_model(options)
        describe(predictor, options.model)  # a graph without a skeleton: one line naming the fix
        print(labelling_config(predictor.skeleton.keypoint_names))
        return 0
    require_extra("vitpose serve", ("starlette", "uvicorn", "python_multipart"), "serve")
    from vitpose.serve import app as serve_app
    from vitpose.serve import server
    from vitpose.serve.labelstudio import TaskImages

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if not _loopback(args.host) and token is None:
        # anyone who reaches the port could run the model and name the Label Studio host of /setup
        raise ServeError(f"--host {args.host} without --token: give --token (or ${TOKEN_ENV}) to listen beyond "
                         f"this machine, or leave --host out (127.0.0.1)")
    sock = server.listen(args.host, args.port)  # before the model loads: a taken port fails at once
    try:  # the door refuses a bad --detector / --precision / --device or a missing model in one line
        predictor = open_model(options, mark_by=args.mark_below_by)
        spec, details = describe(predictor, options.model)
    except BaseException:
        sock.close()
        raise
    max_body = int(args.max_body_mb * 2**20)
    # a file is shown by its name (the page and /v1/model tell no one the server's folders)
    model_name = Path(args.model).name if Path(args.model).exists() else str(args.model)
    settings = serve_app.Settings(model_name=model_name, max_body=max_body, max_pixels=args.max_pixels,
                                  timeout=args.timeout, token=token, mark_below=args.mark_below,
                                  mark_by=args.mark_below_by,
                                  max_in_flight=args.max_in_flight, body_timeout=args.body_timeout,
                                  max_pixels_in_flight=args.max_pixels_in_flight, max_boxes=args.max_boxes,
                                  details=details)
    service = serve_app.open_service(predictor, spec, settings, max_wait=args.max_wait_ms / 1000,
                                     task_images=TaskImages(args.image_dir, args.labelstudio_url, max_bytes=max_body))

    def listening(host, port):
        shown = f"[{host}]" if ":" in host else host
        print(f"vitpose serve: http://{shown}:{port}/  (model {args.model}, "
              f"{details.get('device', details['runtime'])}, max batch {service.runner.max_batch}, "
              f"max wait {args.max_wait_ms:g} ms{', token required' if token else ''})", flush=True)
        auth = ' -H "Authorization: Bearer $TOKEN"' if token else ""
        print(f"vitpose serve: Label Studio labelling config of this model's {len(predictor.skeleton.keypoint_names)} "
              f"keypoints: curl{auth} http://{shown}:{port}/v1/labelstudio-config, or vitpose serve --model "
              f"{args.model} --labelstudio-config  (docs/labelstudio.md)", flush=True)

    try:
        return server.run(serve_app.build_app(service), sock, listening)
    finally:
        service.runner.close(timeout=5)
