"""`serve`: what it refuses and why, then real servers in their own processes, over HTTP on
127.0.0.1, answering as `classify` does, under concurrency, and draining on SIGTERM and Ctrl-C."""

import asyncio
import base64
import collections
import csv
import http.client
import io
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ON_CPU, PROJECT_ROOT, command_env, free_port, on_data, refusal, run_command
from litserve.test_examples import SimpleLitAPI
from PIL import Image
from starlette.requests import Request
from test_warnings import warnings_in

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.image_requests import BadImageRequest, Limits, image_bytes, read_body
from {{ cookiecutter.package_name }}.commands.serve import ClassifierServer

PNG = "image/png"


def encoded(size: tuple[int, int], form: str = "PNG", noise: bool = False) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) if noise else None
    image = Image.fromarray(pixels) if noise else Image.new("RGB", size, "orange")
    buffer = io.BytesIO()
    image.save(buffer, form)
    return buffer.getvalue()


def multipart(data: bytes, field: str = "image") -> tuple[bytes, str]:
    boundary = "imageboundary7d1"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="x.png"\r\n'
            f"Content-Type: image/png\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()  # fmt: skip
    return body, f"multipart/form-data; boundary={boundary}"


def as_json(data: bytes) -> tuple[bytes, str]:
    return json.dumps({"image": base64.b64encode(data).decode()}).encode(), "application/json"


def read_image(body: bytes, content_type: str | None, limits: Limits | None = None, declared: bool = True) -> bytes:
    """What the server reads from a request, the body arriving in chunks of 1000 bytes."""
    headers = [(b"content-type", content_type.encode())] if content_type else []
    if declared:
        headers.append((b"content-length", str(len(body)).encode()))
    chunks = [body[start : start + 1000] for start in range(0, len(body), 1000)] or [b""]
    last = len(chunks) - 1
    messages = [{"type": "http.request", "body": chunk, "more_body": i < last} for i, chunk in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    async def read() -> bytes:
        request = Request({"type": "http", "method": "POST", "path": "/predict", "headers": headers}, receive)
        given = limits or Limits()
        return await image_bytes(request, await read_body(request, given), given)

    return asyncio.run(read())


def test_an_image_sent_any_of_the_three_ways_arrives_as_its_bytes():
    png = encoded((40, 30))
    assert read_image(png, PNG) == png
    assert read_image(png, "application/octet-stream", declared=False) == png
    assert read_image(*multipart(png)) == png
    assert read_image(*as_json(png)) == png
    # A data URL, as a browser's FileReader or canvas gives it, was refused as "not valid base64".
    data_url = json.dumps({"image": "data:image/png;base64," + base64.b64encode(png).decode()}).encode()
    assert read_image(data_url, "application/json") == png


@pytest.mark.parametrize(
    ("body", "content_type", "limits", "status", "reason"),
    [
        (b"", PNG, Limits(), 400, "no body"),
        (b"plain words, not pixels", PNG, Limits(), 400, "not an image"),
        (encoded((40, 30)), "text/plain", Limits(), 415, "text/plain is not one this server reads"),
        (encoded((40, 30)), None, Limits(), 415, "(none)"),
        (encoded((100, 100)), PNG, Limits(pixels=5000), 413, "100 x 100 pixels"),
        (encoded((60, 60), noise=True), PNG, Limits(image_bytes=4000), 413, "this server takes 4,000"),
        (encoded((60, 60), noise=True), PNG, Limits(request_bytes=4000), 413, "this server takes 4,000"),
        (*multipart(encoded((40, 30)), field="photo"), Limits(), 400, 'no file field named "image"'),
        (*multipart(b""), Limits(), 400, "empty"),
        (b'{"picture": "AAAA"}', "application/json", Limits(), 400, 'no "image" string'),
        (b'{"image": "not base64!"}', "application/json", Limits(), 400, "not valid base64"),
        (b'{"image": "data:image/png,%89PNG"}', "application/json", Limits(), 400, "data URL is not base64"),
        (b"{image", "application/json", Limits(), 400, "not JSON"),
    ],
)
def test_a_request_without_a_usable_image_is_refused_with_the_reason(body, content_type, limits, status, reason):
    with pytest.raises(BadImageRequest) as refused:
        read_image(body, content_type, limits)
    assert refused.value.status == status and reason in str(refused.value)


def test_a_body_over_the_limit_is_refused_without_a_declared_length():
    with pytest.raises(BadImageRequest) as refused:
        read_image(encoded((60, 60), noise=True), PNG, Limits(request_bytes=4000), declared=False)
    assert refused.value.status == 413 and "over 4,000 bytes" in str(refused.value)


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_shapes) -> Iterator[Path]:
    """The last checkpoint of one short run on the tiny dataset."""
    folder = tmp_path_factory.mktemp("served")
    shutil.copytree(PROJECT_ROOT / "configs", folder / "configs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "fit", *ON_CPU, *on_data(tiny_shapes),
                                    "--trainer.max_epochs=1"])  # fmt: skip
        main()
    (checkpoint,) = folder.glob("runs/*/*/checkpoints/last.ckpt")
    yield checkpoint
    shutil.rmtree(folder)  # its checkpoints and export are 300 MB, for this module only


def post(port: int, body: bytes | None, content_type: str | None, path="/predict", method="POST") -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def start_server(groups, model: Path, *options: str, **popen) -> tuple[subprocess.Popen, int]:
    # As a terminal starts it, with Ctrl-C's default: a CI job's background shell may have it ignored.
    popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    port = free_port()
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "serve", f"--model={model}", f"--port={port}",
               "--device=cpu", *options]  # fmt: skip
    server = groups(command, env=command_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.read() == b"ok":
                    return server, port
        except (urllib.error.URLError, ConnectionError):
            if server.poll() is not None:
                pytest.fail(f"serve ended with status {server.returncode}:\n{server.stdout.read()[-3000:]}")
            time.sleep(0.3)
    pytest.fail("serve did not answer /health within 120 s")


def classified(monkeypatch, model: Path, images: Path, output: Path) -> dict[Path, list[tuple[str, float]]]:
    """classify's top 3 of each image."""
    run_command(monkeypatch, "classify", str(images), f"--checkpoint={model}", f"--output={output}", "--top-k=3")
    with output.open() as file:
        rows = list(csv.reader(file))[1:]
    return {Path(row[0]): [(row[k], float(row[k + 1])) for k in (1, 3, 5)] for row in rows}


def answered_as(answer: dict, expected: list[tuple[str, float]], tolerance: float) -> bool:
    served = [(item["class"], item["probability"]) for item in answer["predictions"]]
    return [name for name, _ in served] == [name for name, _ in expected] and all(
        abs(probability - wanted) <= tolerance for (_, probability), (_, wanted) in zip(served, expected, strict=True)
    )


def test_the_server_answers_as_classify_under_concurrency_and_refuses_bad_input(
    monkeypatch, groups, model, tiny_shapes, tmp_path
):
    server, port = start_server(groups, model, "--max-batch-size=8", "--batch-timeout=0.05", "--max-pixels=5000",
                                "--max-image-bytes=6000", "--max-request-bytes=20000")  # fmt: skip
    assert f"at http://127.0.0.1:{port}/predict" in server.stdout.readline()
    expected = classified(monkeypatch, model, tiny_shapes / "test", tmp_path / "classified.csv")
    paths = sorted((tiny_shapes / "test").rglob("*.png")) * 2
    forms = [lambda data: (data, PNG), multipart, as_json]

    def ask(index: int) -> tuple[Path, tuple[int, dict]]:
        return paths[index], post(port, *forms[index % 3](paths[index].read_bytes()))

    with ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(ask, range(len(paths))))
    # Each answer is its own image's: none lost, none swapped within a batch. The CSV rounds to 6 places.
    for path, (status, answer) in answers:
        assert status == 200 and answered_as(answer, expected[path], 1e-5), (path, answer, expected[path])

    jpeg = encoded((60, 60), "JPEG", noise=True)
    bad = {
        "not an image": ((b"plain words, not pixels", PNG), 400),
        "a truncated JPEG": ((jpeg[: len(jpeg) // 2], "image/jpeg"), 400),
        "too many pixels": ((encoded((100, 100)), PNG), 413),
        "too many bytes": ((encoded((60, 60), noise=True), PNG), 413),
        "an empty body": ((b"", PNG), 400),
        "a wrong content type": ((encoded((40, 30)), "text/plain"), 415),
        "a request over the limit": ((b"x" * 30000, PNG), 413),
    }
    for name, (request, status) in bad.items():
        got, answer = post(port, *request)
        assert got == status and set(answer) == {"error"} and answer["error"], (name, got, answer)
    # A wrong path or method is answered in the same form, not as FastAPI's {"detail": ...}.
    assert post(port, None, None, method="GET") == (405, {"error": "Method Not Allowed"})
    assert post(port, encoded((40, 30)), PNG, path="/predit") == (404, {"error": "Not Found"})
    # And it keeps serving.
    path = paths[0]
    assert answered_as(post(port, path.read_bytes(), PNG)[1], expected[path], 1e-5)
    assert server.poll() is None


def test_a_server_that_batches_nothing_answers_the_same(monkeypatch, groups, model, tiny_shapes, tmp_path):
    server, port = start_server(groups, model, "--max-batch-size=1")
    expected = classified(monkeypatch, model, tiny_shapes / "test", tmp_path / "classified.csv")
    for path in sorted((tiny_shapes / "test").rglob("*.png"))[::5]:
        status, answer = post(port, path.read_bytes(), PNG)
        assert status == 200 and answered_as(answer, expected[path], 1e-5), (path, answer)
    # Two SIGTERMs (a scheduler and a wrapper both sending one): the second does not cut the drain short.
    server.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    assert "Traceback" not in server.stdout.read()


def start_the_worker_watch(server: ClassifierServer, manager) -> None:
    """What LitServe's run sets up for its thread that watches the model's workers, with no worker."""
    server._shutdown_event, server.inference_workers = manager.Event(), []
    server._transport = SimpleNamespace(close=lambda send_sentinel: None)
    server._start_worker_monitoring(manager, {})


def test_the_worker_watch_stops_quietly_when_the_server_stops(caplog, monkeypatch):
    # LitServe's thread that watches the model's workers asked the manager's event after the shutdown
    # had ended the manager, and printed a traceback (one CI run in several). Here it looks every 50 ms.
    monkeypatch.setattr(logging.getLogger("litserve"), "propagate", True)  # LitServe logs to its own handler
    server = ClassifierServer(SimpleLitAPI(), accelerator="cpu", devices=1)
    server.monitor_internal = 0.05
    with multiprocessing.Manager() as manager, caplog.at_level(logging.INFO, logger="litserve"):
        start_the_worker_watch(server, manager)
        server._perform_graceful_shutdown(manager, {}, "keyboard_interrupt")
        time.sleep(0.5)
    assert "Shutting down LitServe" in caplog.text and "crashed" not in caplog.text


def test_stopping_does_not_wait_out_the_worker_watchs_pause():
    server = ClassifierServer(SimpleLitAPI(), accelerator="cpu", devices=1)
    with multiprocessing.Manager() as manager:
        start_the_worker_watch(server, manager)
        time.sleep(0.1)  # the watch has looked once and pauses until its next look
        started = time.monotonic()
        server._perform_graceful_shutdown(manager, {}, "normal")
        # The pause is 0.25 s; it was LitServe's 2 s, all of it added to every stop.
        assert time.monotonic() - started < 1.5


def test_a_server_of_the_onnx_export_answers_the_same_and_drains_on_sigterm(
    monkeypatch, groups, model, tiny_shapes, tmp_path
):
    run_command(monkeypatch, "export", str(model), "--format=onnx", f"--images={tiny_shapes / 'test'}")
    expected = classified(monkeypatch, model, tiny_shapes / "val", tmp_path / "classified.csv")
    # Batches wait a second to fill: the requests below are still in flight when SIGTERM comes.
    server, port = start_server(groups, model.with_suffix(".onnx"), "--max-batch-size=64", "--batch-timeout=1")
    paths = sorted((tiny_shapes / "val").rglob("*.png"))
    with ThreadPoolExecutor(len(paths)) as clients:
        asked = [clients.submit(post, port, path.read_bytes(), PNG) for path in paths]
        time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        answers = [request.result() for request in asked]
    for path, (status, answer) in zip(paths, answers, strict=True):
        assert status == 200 and answered_as(answer, expected[path], 1e-4), (path, answer)
    assert server.wait(timeout=60) == 0
    assert "SIGTERM: answering the requests in flight" in server.stdout.read()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_to_its_group_in_a_burst_answers_every_connection_it_took_and_refuses_the_rest(
    groups, model, tiny_shapes, stop
):
    # `timeout` or a terminal (Ctrl-C) signals the server and all its processes at once; the server
    # alone (docker stop) takes the same path, with the helpers' part left out. Ctrl-C had the HTTP
    # process stop on its own, closing connections it had taken.
    server, port = start_server(groups, model)
    image = sorted((tiny_shapes / "test").rglob("*.png"))[0].read_bytes()
    outcomes, stopping = [], threading.Event()

    def client() -> None:
        while not stopping.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.connect()
            except OSError:  # refused, or no answer to the handshake: never accepted
                outcomes.append("not accepted")
                continue
            try:
                connection.request("POST", "/predict", body=image, headers={"Content-Type": PNG})
                answer = connection.getresponse()
                outcomes.append(answer.status if answer.read() else "empty")
            except (OSError, http.client.HTTPException) as error:  # reset, or closed without an answer
                outcomes.append(type(error).__name__)
            finally:
                connection.close()

    clients = [threading.Thread(target=client) for _ in range(16)]
    for thread in clients:
        thread.start()
    time.sleep(1.5)
    os.killpg(server.pid, stop)
    sent = time.monotonic()
    status = server.wait(timeout=60)
    exited = time.monotonic() - sent
    stopping.set()
    for thread in clients:
        thread.join()
    assert set(outcomes) == {200, "not accepted"}, collections.Counter(outcomes)
    output = server.stdout.read()
    assert status == 0 and exited < 5, (status, exited, output)
    assert "ERROR" not in output and "Traceback" not in output, output
    assert warnings_in(output) == [], "a warning not on test_warnings.py's allow-list"


def test_a_server_started_with_ctrl_c_ignored_serves_on_through_one(groups, model):
    # As a script's `serve &` starts it: its HTTP process ended on a Ctrl-C to the group, and the
    # server stayed up with nothing answering.
    server, port = start_server(groups, model, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    os.killpg(server.pid, signal.SIGINT)
    time.sleep(2)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
        assert answer.read() == b"ok"
    os.killpg(server.pid, signal.SIGTERM)
    assert server.wait(timeout=60) == 0, server.stdout.read()[-3000:]


def test_without_litserve_it_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "litserve", None)
    monkeypatch.delitem(sys.modules, "{{ cookiecutter.package_name }}.commands.serve", raising=False)
    message = refusal(monkeypatch, capsys, "serve", "--model=model.ckpt")
    assert message == 'error: Serving needs LitServe, the serve extra: pip install -e ".[serve]"'


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        (
            ["--model=notes.txt"],
            "notes.txt is not a Lightning checkpoint, or is damaged: point --model at a .ckpt file that training "
            "wrote (runs/<project>/<run>/checkpoints/) or at an .onnx export.",
        ),
        (["--model=broken.onnx"], "broken.onnx is not an ONNX model onnxruntime can run"),
        ([], ": run from the project folder, or pass --runs."),  # no configs here to say where runs go
        (["--devices=two"], "--devices two: give a number of GPUs"),
        (["--device=cpu", "--devices=2"], "--devices 2: --device cpu serves from one device; more model copies"),
        (["--max-pixels=0"], "--max-pixels must be 1 or more, got 0 (python -m"),
        (["--max-request-bytes=-5"], "--max-request-bytes must be 1 or more, got -5 (python -m"),
        (["--port=80"], "--port 80 is out of range"),
        (["--max-batch-size=0"], "--max-batch-size must be 1 or more, got 0 (python -m"),
        (["--batch-timeout=-1"], "--batch-timeout must be 0 or more, got -1.0 (python -m"),
        (["--host=10.1.2.3"], "argument --host: invalid choice: '10.1.2.3' (choose from "),
    ],
)
def test_a_server_that_cannot_start_says_why_in_one_line(monkeypatch, capsys, tmp_path, given, reason):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "broken.onnx").write_bytes(b"not a graph")
    assert reason in refusal(monkeypatch, capsys, "serve", *given)


def test_weights_that_do_not_load_are_one_line_before_serving(monkeypatch, capsys, model, tmp_path):
    # Each worker failed to load them in a traceback, after "Serving ... at http://...".
    saved = torch.load(model, map_location="cpu", weights_only=True)
    saved["state_dict"].pop("backbone.fc.bias")
    torch.save(saved, tmp_path / "doctored.ckpt")
    line = refusal(monkeypatch, capsys, "serve", f"--model={tmp_path / 'doctored.ckpt'}", f"--port={free_port()}")
    assert line.startswith(f"error: The weights in {tmp_path / 'doctored.ckpt'} do not fit the model"), line


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_port_in_use_is_named(monkeypatch, capsys, host):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refusal(monkeypatch, capsys, "serve", f"--host={host}", f"--port={port}")
    assert message == f"error: Port {port} of 127.0.0.1 is in use: stop what holds it, or pick another --port."
