"""`vitpose serve`: poses over HTTP, with request batching, a web page and a Label Studio ML backend.

    vitpose serve                                     # http://127.0.0.1:8000/ : the page
    vitpose serve --model vitpose-s --max-batch 16 --max-wait-ms 10
    vitpose serve --model mine.onnx --detector full-frame --token "$TOKEN" --host 0.0.0.0
    curl -F image=@photo.jpg http://127.0.0.1:8000/v1/predict          # the records of `predict --json`
    curl --data-binary @photo.jpg "http://127.0.0.1:8000/v1/predict?format=labelstudio"

The model loads once through `vitpose.load_model` (a published name, an HF repo id, a weights file;
or an exported .onnx file or OpenVINO IR through the factory `vitpose predict --model` uses). Concurrent requests share forward
passes: the crops of several images go through the network together, up to --max-batch crops,
waiting at most --max-wait-ms for more (vitpose.serve.batching). Endpoints, limits and errors:
vitpose/serve/app.py; Label Studio (Settings > Model > Connect model, URL of this server):
vitpose/serve/labelstudio.py.

It listens on loopback unless --host says otherwise; give --token when it does not. SIGTERM stops
accepting connections, answers the requests in flight and exits 0; Ctrl-C does the same and exits 130.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from vitpose.errors import UserError

DEFAULT_MODEL = "vitpose-b-simple"
TOKEN_ENV = "VITPOSE_SERVE_TOKEN"


class ServeError(UserError):
    """A problem with `vitpose serve`'s command line (one line, exit status 2)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("serve", help="poses over HTTP: API, web page, Label Studio ML backend",
                              shared=("--config", "--device", "--debug"), description=doc[0],
                              epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="a published name, an HF repo id, a weights file, an exported .onnx file or an OpenVINO IR "
                        "(its .xml or folder; vitpose export --format openvino) (default: %(default)s)")
    p.add_argument("--config", default=None, metavar="FILE|NAME",
                   help="the run config the weights were trained with (a YAML file or a shipped config's name, "
                        "as for vitpose train); its model section and skeleton describe them. Default: what the "
                        "file records, or its tensor shapes")
    p.add_argument("--detector", default="default",
                   help="default | none (every request sends boxes) | full-frame | a name of "
                        "vitpose.inference.detect.DETECTORS (default: %(default)s)")
    p.add_argument("--detector-threshold", type=float, default=None, help="minimum person score (default 0.3)")
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
    p.add_argument("--max-pixels", type=int, default=None,
                   help="largest image in pixels, read from its header before decoding (default: $VITPOSE_MAX_PIXELS "
                        "or 150000000)")
    p.add_argument("--image-dir", type=Path, default=None,
                   help="Label Studio: the folder of the tasks' images (local files or uploads), read by file name")
    p.add_argument("--labelstudio-url", default=None,
                   help="Label Studio: fetch task images from this server (token: $LABEL_STUDIO_API_KEY or /setup's)")
    p.add_argument("--mark-below", type=float, default=0.3,
                   help="labelstudio/cvat answers: keypoints scored below this are marked (default: %(default)s)")
    p.add_argument("--no-flip", action="store_true", help="skip the flip test (about 2x faster)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="as vitpose predict --precision (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when available)")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.set_defaults(run=run)
    return p


def _check_flags(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch is not None and args.max_batch < 1:
        raise ServeError(f"--max-batch must be >= 1, got {args.max_batch}")
    if not 0 <= args.max_wait_ms <= 10_000:
        raise ServeError(f"--max-wait-ms must be in 0..10000, got {args.max_wait_ms}")
    if not args.timeout > 0:
        raise ServeError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.max_in_flight < 1:
        raise ServeError(f"--max-in-flight must be >= 1, got {args.max_in_flight}")
    if not args.max_body_mb > 0:
        raise ServeError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    if args.max_pixels is not None and args.max_pixels < 0:
        raise ServeError(f"--max-pixels must be >= 0 (0 = no limit), got {args.max_pixels}")
    if args.detector_threshold is not None and not 0.0 <= args.detector_threshold <= 1.0:
        raise ServeError(f"--detector-threshold must be in [0, 1], got {args.detector_threshold}")
    if not 0.0 <= args.mark_below <= 1.0:
        raise ServeError(f"--mark-below must be in [0, 1], got {args.mark_below}")
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


def load_predictor(args):
    """(predictor, spec, skeleton details) through the one door: `vitpose.Predictor.from_pretrained`
    (`vitpose.load_model`), or for an exported file (.onnx, an OpenVINO IR's .xml or folder) the
    factory `vitpose predict --model` uses (`vitpose.inference.onnx.load_exported`: the file's
    ModelSpec, its skeleton, the device and provider checks)."""
    import vitpose
    from vitpose.device import resolve_device, tune_cpu_allocator
    from vitpose.inference.onnx import exported_device, is_exported, is_openvino, load_exported

    detector = None if args.detector == "none" else args.detector
    if is_exported(args.model):  # the door `vitpose predict --model` takes (vitpose.inference.onnx.load_exported)
        try:
            device = exported_device(args.model, args.device)
        except ValueError as e:
            raise ServeError(f"--device: {e}") from None
        predictor = load_exported(args.model, device, requested_device=args.device, config=args.config,
                                  precision=args.precision, flip_test=not args.no_flip, batch_size=args.max_batch,
                                  detector=detector, detector_threshold=args.detector_threshold)
        if predictor.skeleton is None:
            raise ServeError(f"--model {args.model}: a graph of {predictor.num_keypoints} keypoints that records no "
                             f"skeleton; the server needs the keypoints' names (export it with this version, or "
                             f"serve the weights file)")
        runtime = "openvino" if is_openvino(args.model) else "onnxruntime"
        return predictor, getattr(predictor, "spec", None), {"runtime": runtime, "flip_test": predictor.flip_test}
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        raise ServeError(f"--device: {e}") from None
    tune_cpu_allocator(device)  # a server runs models pass after pass (vitpose.device)
    predictor = vitpose.Predictor.from_pretrained(args.model, detector=detector, device=device, config=args.config,
                                                  flip_test=not args.no_flip, precision=args.precision,
                                                  detector_threshold=args.detector_threshold)
    precision = {None: "fp32"}.get(predictor.amp_dtype, str(predictor.amp_dtype).replace("torch.", ""))
    return predictor, getattr(predictor.model, "spec", None), {
        "runtime": "torch", "device": str(predictor.device), "precision": precision, "flip_test": predictor.flip_test}


def run(args) -> int:
    _check_flags(args)
    try:
        import python_multipart  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ServeError(f'vitpose serve needs {e.name}, not installed: pip install "vitpose[serve]"') from None
    from vitpose.serve import app as serve_app
    from vitpose.serve import server
    from vitpose.serve.batching import BatchRunner, Metrics
    from vitpose.serve.labelstudio import TaskImages

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if not _loopback(args.host) and token is None:
        print(f"vitpose serve: warning: listening on {args.host} without --token: anyone who reaches this port "
              f"can use the model", file=sys.stderr)
    sock = server.listen(args.host, args.port)  # before the model loads: a taken port fails at once
    try:
        predictor, spec, details = load_predictor(args)
    except BaseException:
        sock.close()
        raise
    max_body = int(args.max_body_mb * 2**20)
    # a file is shown by its name (the page and /v1/model tell no one the server's folders)
    model_name = Path(args.model).name if Path(args.model).exists() else str(args.model)
    settings = serve_app.Settings(model_name=model_name, max_body=max_body, max_pixels=args.max_pixels,
                                  timeout=args.timeout, token=token, mark_below=args.mark_below,
                                  max_in_flight=args.max_in_flight, details=details)
    metrics = Metrics()
    runner = BatchRunner(predictor, args.max_batch or predictor.batch_size, args.max_wait_ms / 1000, metrics)
    task_images = TaskImages(args.image_dir, args.labelstudio_url, max_bytes=max_body)
    service = serve_app.Service(predictor, spec, settings, runner, metrics, task_images)

    def listening(host, port):
        shown = f"[{host}]" if ":" in host else host
        print(f"vitpose serve: http://{shown}:{port}/  (model {args.model}, "
              f"{details.get('device', details['runtime'])}, max batch {runner.max_batch}, "
              f"max wait {args.max_wait_ms:g} ms{', token required' if token else ''})", flush=True)

    try:
        return server.run(serve_app.build_app(service), sock, listening)
    finally:
        runner.close(timeout=5)
