"""`python -m {{ cookiecutter.package_name }} serve [--model CKPT_OR_ONNX]`: the top classes over HTTP (LitServe).

POST one image to http://HOST:PORT/predict: as the body (Content-Type image/jpeg, image/png, ... or
application/octet-stream), as a multipart upload named "image", or as JSON {"image": "<base64>"}.
The answer is JSON, {"predictions": [{"class": "...", "probability": 0.93}, ...]}, best first;
a request that carries no usable image gets a 4xx and {"error": "..."}. GET /health answers "ok"
once the model is loaded, GET /info describes it. Requests arriving together are predicted as one
batch (up to --max-batch-size, waiting at most --batch-timeout seconds for it to fill).

The model is a checkpoint (default: the best of the newest run) or an ONNX export, run through
onnxruntime. Images are prepared as validation prepared them, as `classify` does. SIGTERM, to the
server or to its whole process group, stops taking connections, answers every request on those it
took, and exits with status 0.
"""

import ctypes
import os
import signal
import socket
import struct
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool

from ..cli import configured_runs
from ..datasets.images import DECODE_ERRORS
from ..errors import PACKAGE, CommandParser, ConfigError
from ..model import load_trained
from ..training import sigterm
from ..training.predictions import top_classes
from ..training.resume import check_checkpoint
from ..training.run_folders import best_checkpoint
from .image_requests import BadImageRequest, Limits, image_bytes, read_body
from .predictor import Predictor, check_device, is_onnx

try:  # the `serve` extra
    import litserve as ls
    from fastapi import Depends, HTTPException, Request
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as AnyHTTPException  # FastAPI's, and the router's 404 and 405
except ImportError as missing:
    raise ConfigError('Serving needs LitServe, the serve extra: pip install -e ".[serve]"') from missing

HOSTS = {"127.0.0.1": "this machine only", "0.0.0.0": "every IPv4 interface", "::": "every interface"}
HOST_NAMES = {"localhost": "127.0.0.1"}


async def prepared_image(request: Request) -> np.ndarray:
    """The request's image, decoded and resized as validation does, or a 4xx naming what is wrong.

    This runs in the HTTP server processes, not in the model's worker: a bad image fails its own
    request alone (LitServe fails a whole batch with one of its inputs), and decoding, the costly
    part, runs beside the model instead of between its batches."""
    predictor, limits = request.app.state.predictor, request.app.state.limits
    try:
        data = await image_bytes(request, await read_body(request, limits), limits)
        image = await run_in_threadpool(predictor.prepare, data)
    except BadImageRequest as error:
        raise HTTPException(error.status, str(error)) from None
    except DECODE_ERRORS as error:
        raise HTTPException(400, f"The image cannot be decoded: {error}.") from None
    # An array, not a tensor: torch would share a tensor through shared memory across the queues.
    return image.numpy()


class ClassifierAPI(ls.LitAPI):
    """The model's worker: a batch of prepared images in, each image's top classes out."""

    def __init__(self, predictor: Predictor, top_k: int, max_batch_size: int, batch_timeout: float) -> None:
        with warnings.catch_warnings():  # batch size 1 is a choice, not a forgotten setting
            warnings.filterwarnings("ignore", "The LitServer has both batch and unbatch", UserWarning)
            super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.predictor = predictor
        self.top_k = top_k
        self.server_pid = os.getpid()

    def setup(self, device: str) -> None:
        sigterm.leave_to(self.server_pid)  # the worker is spawned, and answers until the server ends it
        self.predictor.load(device)

    # LitServe hands the endpoint's argument, typed by this annotation, to decode_request.
    def decode_request(self, request: Annotated[np.ndarray, Depends(prepared_image)]) -> np.ndarray:
        return request

    def batch(self, inputs: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(inputs))

    def predict(self, images: torch.Tensor | np.ndarray) -> list:
        # LitServe calls batch() and unbatch() only when it batches: with max batch size 1, one image comes alone.
        alone = isinstance(images, np.ndarray)
        top = top_classes(self.predictor(images[None] if alone else images), self.predictor.class_names, self.top_k)
        return top[0] if alone else top

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, top: list[tuple[str, float]]) -> dict:
        return {"predictions": [{"class": name, "probability": probability} for name, probability in top]}


class ClassifierServer(ls.LitServer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The shutdown below waits for the worker watch to stop, which it does between two looks:
        # LitServe's 2 s between looks added up to 2 s to every stop.
        self.monitor_internal = 0.25

    def launch_inference_worker(self, lit_api: ls.LitAPI) -> list:
        # A spawned worker imports numpy, whose BLAS starts a thread before the worker's setup leaves
        # a group's SIGTERM to the server: that thread would take it, and the worker would end
        # mid-request. The worker computes with torch, not numpy's BLAS.
        blas_threads = os.environ.get("OPENBLAS_NUM_THREADS")
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        try:
            return super().launch_inference_worker(lit_api)
        finally:
            if blas_threads is None:
                del os.environ["OPENBLAS_NUM_THREADS"]
            else:
                os.environ["OPENBLAS_NUM_THREADS"] = blas_threads

    def _perform_graceful_shutdown(self, manager, uvicorn_workers: dict, shutdown_reason: str = "normal") -> None:
        # LitServe's thread that watches the model's workers asks the manager's event between looks
        # whether to stop; asked after this shutdown has ended the manager, it died with a traceback in
        # the server's output. From here on it reads an event already set, and the manager ends once it
        # has stopped (its look in flight could otherwise meet the manager's end).
        stopping = threading.Event()
        stopping.set()
        self._shutdown_event = stopping
        for watch in threading.enumerate():
            if watch.name == "litserve-monitoring" and watch is not threading.current_thread():
                watch.join(timeout=self.monitor_internal + 1)
        super()._perform_graceful_shutdown(manager, uvicorn_workers, shutdown_reason)


async def error_as_json(request: Request, error: AnyHTTPException) -> JSONResponse:
    return JSONResponse({"error": error.detail}, status_code=error.status_code, headers=error.headers)


def stop_on_signal(port: int):
    """LitServe stops on KeyboardInterrupt by letting its HTTP servers answer the requests in flight
    before it stops the model's workers: SIGTERM (docker stop, Kubernetes, Slurm) and Ctrl-C take that
    path, once the connections the kernel had already accepted are taken and their requests read."""

    def stop(signum: int, frame) -> None:
        print(f"{sigterm.signal_said(signum)}: answering the requests in flight, then stopping.", flush=True)
        for each in STOPS:  # a second one (or the other) must not cut the drain short
            signal.signal(each, signal.SIG_IGN)
        listener = stop_taking_connections(port)
        if listener is not None:
            with listener:
                wait_until_taken(listener)
            time.sleep(REQUEST_ARRIVAL)
        raise KeyboardInterrupt

    return stop


# The signals that stop the server the same way: SIGTERM, and Ctrl-C's SIGINT.
STOPS = (signal.SIGTERM, signal.SIGINT)
# uvicorn closes a connection with no request yet when it stops: one just taken gets this long to send it.
REQUEST_ARRIVAL = 0.5
DROP_EVERY_PACKET = struct.pack("HBBI", 0x06, 0, 0, 0)  # a classic BPF program of one instruction, "ret #0"
SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)


def stop_taking_connections(port: int) -> socket.socket | None:
    """The server's listening socket, from now on completing no new connection: the kernel drops the
    packets that would open one, and those clients are refused once the server has exited. Closing
    it instead would reset the connections the kernel had queued for it. Linux only (socket filters)."""
    if sys.platform != "linux":
        return None
    for fd in os.listdir("/proc/self/fd"):  # LitServe binds the socket inside run(), out of reach
        try:
            candidate = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # not a socket, or the listing's own folder
            continue
        if (
            candidate.family in (socket.AF_INET, socket.AF_INET6)
            and candidate.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            and candidate.getsockname()[1] == port
        ):
            program = ctypes.create_string_buffer(DROP_EVERY_PACKET, len(DROP_EVERY_PACKET))
            candidate.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HP", 1, ctypes.addressof(program)))
            return candidate
        candidate.close()
    return None


def wait_until_taken(listener: socket.socket, timeout: float = 10) -> None:
    """Until the HTTP servers have taken every connection queued on the listener: tcpi_unacked,
    the fifth field of TCP_INFO, is a listening socket's queue length on Linux."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if struct.unpack_from("I", listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32), 24)[0] == 0:
            return
        time.sleep(0.01)


def in_each_forked_child(server_pid: int) -> None:
    # The HTTP servers set their own handler, which uvicorn turns into finishing their requests;
    # a SIGTERM to the whole group is left to the server, which ends them once it stopped taking connections.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sigterm.leave_to(server_pid)


def check_devices(device: str, devices: str) -> int | str:
    """--devices as LitServe takes it, once this machine is known to have them."""
    if devices != "auto" and not (devices.isdigit() and int(devices) >= 1):
        raise ConfigError(f"--devices {devices}: give a number of GPUs, 1 or more, or auto.")
    if device != "auto":
        check_device(device)
    gpus = torch.cuda.device_count()
    if devices.isdigit() and int(devices) > gpus and device in ("cuda", "auto") and gpus:
        raise ConfigError(f"--devices {devices}: this machine has {gpus} GPU(s).")
    if devices.isdigit() and int(devices) > 1 and (device in ("cpu", "mps") or not gpus):
        on = f"--device {device}" if device != "auto" else "a machine without CUDA GPUs"
        raise ConfigError(f"--devices {devices}: {on} serves from one device; more model copies: --workers-per-device.")
    return int(devices) if devices.isdigit() else devices


def check_port(host: str, port: int) -> None:
    if not 1024 <= port <= 65535:
        raise ConfigError(f"--port {port} is out of range: pick one from 1024 to 65535.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((host, port))
        except OSError:
            raise ConfigError(f"Port {port} of {host} is in use: stop what holds it, or pick another --port.") from None


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} serve", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a checkpoint or an .onnx export (default: the newest run's best)")
    parser.add_argument("--runs", type=Path, help="where the runs are (default: where fit puts them)")
    # LitServe binds only these three addresses; localhost is this machine's, by its name.
    parser.add_argument("--host", default="127.0.0.1", choices=HOSTS, type=lambda host: HOST_NAMES.get(host, host),
                        help="0.0.0.0 to be reached from other machines")  # fmt: skip
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--devices", default="auto", help="how many GPUs to use, or auto: all of them")
    parser.add_argument("--workers-per-device", type=int, default=1, help="model copies per device")
    parser.add_argument("--max-batch-size", type=int, default=8, help="1 predicts each request alone")
    parser.add_argument("--batch-timeout", type=float, default=0.005, help="seconds a batch waits to fill")
    parser.add_argument("--top-k", type=int, default=3, help="classes per answer")
    parser.add_argument("--max-request-bytes", type=int, default=Limits.request_bytes)
    parser.add_argument("--max-image-bytes", type=int, default=Limits.image_bytes)
    parser.add_argument("--max-pixels", type=int, default=Limits.pixels, help="width x height of the largest image")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    options = parser.parse_args(args)
    least = {"--workers-per-device": 1, "--max-batch-size": 1, "--top-k": 1, "--batch-timeout": 0}
    least |= dict.fromkeys(["--max-request-bytes", "--max-image-bytes", "--max-pixels"], 1)
    parser.check_at_least(options, least)
    devices = check_devices(options.device, options.devices)
    check_port(options.host, options.port)
    model = options.model or best_checkpoint(options.runs or configured_runs(), "--model")
    if not is_onnx(model):
        check_checkpoint(str(model), "--model", takes_onnx=True)
        # Read once here, where weights that do not load are one line; each worker would fail in a traceback.
        load_trained(model, "cpu")

    predictor = Predictor(model)
    api = ClassifierAPI(predictor, options.top_k, options.max_batch_size, options.batch_timeout)
    server = ClassifierServer(
        api, accelerator=options.device, devices=devices, workers_per_device=options.workers_per_device,
        model_metadata={"model": str(predictor.model), "classes": predictor.class_names,
                        "preprocessing": predictor.preprocessing.describe()},
    )  # fmt: skip
    server.app.state.predictor = predictor
    server.app.state.limits = Limits(options.max_request_bytes, options.max_image_bytes, options.max_pixels)
    server.app.add_exception_handler(AnyHTTPException, error_as_json)
    stop = stop_on_signal(options.port)
    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored from the start (`serve &` in a script): kept so
        signal.signal(signal.SIGINT, stop)
    server_pid = os.getpid()
    os.register_at_fork(after_in_child=lambda: in_each_forked_child(server_pid))
    placed = ", ".join(str(group[0] if isinstance(group, list) else group) for group in server.devices)
    address = f"[{options.host}]" if ":" in options.host else options.host
    print(f"Serving {predictor.model} on {placed} at http://{address}:{options.port}/predict "
          f"({HOSTS[options.host]}); GET /health answers ok once the model is loaded.", flush=True)  # fmt: skip
    server.run(host=options.host, port=options.port, log_level=options.log_level, generate_client_file=False)
    return 0
