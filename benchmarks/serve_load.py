"""`serve` under load: served images/s, p50 and p99 latency and errors, with N concurrent clients,
for max batch sizes 1 and 8, the PyTorch checkpoint against its ONNX export; and the images/s of
the same model in-process on the same images.

Run from the template's root:

    .venv/bin/python benchmarks/serve_load.py [--requests 400] [--clients 8] [--image-size 224]

A project is rendered (its default backbone at --image-size px), trained for two steps on drawn
shapes (the figures are of speed, not accuracy) and exported to ONNX. Each server runs on the CPU
in its own processes on 127.0.0.1. The clients are threads of this process, each with its own
keep-alive connection, posting JPEG bodies (drawn shapes, 320 px, quality 90) until --requests are
answered, after --warmup requests. In-process is `classify`'s code path (decode, resize, model) in
batches of 8 in one process: the ratio shows what HTTP, queues and batching cost or gain.
"""

import argparse
import http.client
import io
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from rendered import render_project


def draw_jpegs(count: int) -> list[bytes]:
    import numpy as np
    from image_classifier.datasets.shapes import CLASSES, draw_shape

    images = []
    for index in range(count):
        buffer = io.BytesIO()
        draw_shape(CLASSES[index % len(CLASSES)], 320, np.random.default_rng([index])).save(buffer, "JPEG", quality=90)
        images.append(buffer.getvalue())
    return images


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.read() == b"ok":
                    return
        except OSError:
            if server.poll() is not None:
                sys.exit(f"serve ended with status {server.returncode}: {server.stdout.read()[-2000:]}")
            time.sleep(0.3)
    sys.exit("serve did not become healthy within 180 s")


def load(port: int, images: list[bytes], requests: int, clients: int) -> tuple[float, list[float], int]:
    """Post `requests` images from `clients` threads: (seconds, latencies, errors)."""
    next_index, lock, latencies, errors = iter(range(requests)), threading.Lock(), [], []

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                break
            started = time.perf_counter()
            try:
                connection.request("POST", "/predict", images[index % len(images)], {"Content-Type": "image/jpeg"})
                answer = connection.getresponse()
                answer.read()
                ok = answer.status == 200
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                ok = False
            with lock:
                (latencies if ok else errors).append(time.perf_counter() - started)
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, latencies, len(errors)


def in_process(model: Path, images: list[bytes], count: int) -> float:
    """Images/s of classify's code path in this process, batches of 8."""
    import torch
    from image_classifier.commands.predictor import Predictor

    predictor = Predictor(model).load("cpu")
    batches = [[images[index % len(images)] for index in range(start, start + 8)] for start in range(0, count, 8)]
    predictor(torch.stack([predictor.prepare(image) for image in batches[0]]))  # warm-up
    started = time.perf_counter()
    for batch in batches:
        predictor(torch.stack([predictor.prepare(image) for image in batch]))
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        src = render_project(Path(scratch) / "project", f"image_size={args.image_size}", "serving=yes")
        project = src.parent
        env = os.environ | {"PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"}
        sys.path.insert(0, str(src))
        from image_classifier.datasets.shapes import draw_shapes_dataset

        data = draw_shapes_dataset(Path(scratch) / "shapes", {"train": 4, "val": 2}, size=args.image_size)
        on_cpu = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
                  "--trainer.precision=32-true", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                  f"--data.data_dir={data}", "--data.synthetic=false", "--data.num_workers=0"]  # fmt: skip
        module = [sys.executable, "-m", "image_classifier"]
        subprocess.run([*module, "fit", *on_cpu], cwd=project, env=env, check=True, capture_output=True)
        (checkpoint,) = project.glob("runs/*/*/checkpoints/last.ckpt")
        subprocess.run([*module, "export", str(checkpoint), f"--images={data}"], cwd=project, env=env, check=True,
                       capture_output=True)  # fmt: skip
        images = draw_jpegs(64)
        megapixels = 320 * 320 / 1e6

        import torch

        print(f"{os.cpu_count()} CPUs, torch {torch.__version__}; {args.image_size} px model, JPEGs of "
              f"{megapixels:.2f} MP, {args.clients} clients, {args.requests} requests")  # fmt: skip
        baseline = {form: in_process(model, images, args.requests) for form, model in
                    (("pytorch", checkpoint), ("onnx", checkpoint.with_suffix(".onnx")))}  # fmt: skip
        header = f"{'model':>8} {'batch':>6} {'images/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'errors':>7}"
        print(f"{header} {'/ in-process':>13}")
        for form, model in (("pytorch", checkpoint), ("onnx", checkpoint.with_suffix(".onnx"))):
            print(f"{form:>8} {'-':>6} {baseline[form]:>9.1f} {'-':>7} {'-':>7} {'-':>7} {'(in-process)':>13}")
            for batch in (1, 8):
                port = free_port()
                server = subprocess.Popen(
                    [*module, "serve", f"--model={model}", f"--port={port}", "--device=cpu",
                     f"--max-batch-size={batch}", "--batch-timeout=0.01"],
                    cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                )  # fmt: skip
                try:
                    wait_until_healthy(port, server)
                    load(port, images, args.warmup, args.clients)
                    seconds, latencies, errors = load(port, images, args.requests, args.clients)
                finally:
                    server.terminate()
                    server.wait(timeout=60)
                rate = len(latencies) / seconds
                p50, p99 = (statistics.quantiles(latencies, n=100)[k] * 1000 for k in (49, 98))
                print(f"{form:>8} {batch:>6} {rate:>9.1f} {p50:>7.1f} {p99:>7.1f} {errors:>7} "
                      f"{rate / baseline[form]:>13.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
