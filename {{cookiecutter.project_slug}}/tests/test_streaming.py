"""Sharded streaming data (LitData): `shard`, training from the chunks on one and two processes and
from an S3-compatible store. Exact and preempted resumes of streaming runs: test_exact_resume.py."""

import csv
import json
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import litdata
import pytest
import torch
from conftest import ON_CPU, command_env, on_data, refusal, run_command, shard
from test_data import make_folder, with_broken_images
from test_distributed import by_hand, free_port
from test_exact_resume import FORMAT_OF, fit_command, logged_to, plain_images, record, seen_images

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import ImageDataModule, StreamingDataModule{{ ", checkpoint_preprocessing" if cookiecutter.inference == "yes" }}
from {{ cookiecutter.package_name }}.datasets.shapes import draw_shapes_dataset
from {{ cookiecutter.package_name }}.datasets.streaming import MANIFEST
from {{ cookiecutter.package_name }}.errors import ConfigError, DataError, MissingError
from {{ cookiecutter.package_name }}.model import ImageClassifier


def streaming(location: str | Path, batch_size: int = 4, workers: int = 0) -> list[str]:
    return [*on_data(location, batch_size), *FORMAT_OF["shards"], f"--data.num_workers={workers}"]


def stored(location: Path, split: str) -> list[dict]:
    dataset = litdata.StreamingDataset(str(location / split))
    return [dataset[i] for i in range(len(dataset))]


def test_shard_stores_each_file_as_it_is_with_its_label_and_path(shards, tiny_shapes):
    manifest = json.loads((shards / MANIFEST).read_text())
    classes = sorted(folder.name for folder in (tiny_shapes / "train").iterdir())
    assert manifest["classes"] == classes
    for split in ("train", "val", "test"):
        samples = stored(shards, split)
        files = sorted((tiny_shapes / split).glob("*/*.png"))
        assert manifest["splits"][split]["images"] == len(samples) == len(files)
        assert sorted(sample["path"] for sample in samples) == [str(f.relative_to(tiny_shapes)) for f in files]
        for sample in samples:
            original = tiny_shapes / sample["path"]
            assert bytes(sample["image"]) == original.read_bytes()  # not re-encoded
            assert sample["label"] == classes.index(original.parent.name)


def test_a_streamed_training_batch_mixes_the_classes_as_a_folder_batch_does(monkeypatch, tmp_path):
    # Enough images that LitData's shuffle alone, within the chunks a worker holds, leaves batches of a
    # class or two. 16 images drawn at random from 6 classes hold 6 x (1 - (5/6)^16) = 5.6 of them on average.
    images = draw_shapes_dataset(tmp_path / "shapes", images_per_class={"train": 60, "val": 1, "test": 1}, size=32)
    shard(monkeypatch, images, tmp_path / "shards")  # train/ read in class order
    module = StreamingDataModule(tmp_path / "shards", format="streaming", synthetic=False, num_workers=0, batch_size=16)
    module.setup("fit")
    classes = [len(set(labels.tolist())) for _, labels in module.train_dataloader()]
    assert sum(classes) / len(classes) > 5, classes


def test_class_folders_are_split_as_the_folder_format_splits_them(monkeypatch, tiny_shapes, tmp_path):
    output = tmp_path / "shards"
    shard(monkeypatch, tiny_shapes / "train", output)  # class folders only: 12 images of each class
    folders = ImageDataModule(tiny_shapes / "train", num_workers=0)
    folders.setup("fit")
    for split, dataset in (("train", folders.train_set), ("val", folders.val_set)):
        paths = sorted(str(tiny_shapes / "train" / sample["path"]) for sample in stored(output, split))
        assert paths == sorted(path for path, _ in dataset.samples)


def test_shard_leaves_the_staging_folders_of_other_shard_commands_alone(monkeypatch, tiny_shapes, tmp_path):
    # LitData stages chunks in the machine's temporary folder and empties it as a write starts: a
    # second shard command on the same machine deleted the first one's chunks before it uploaded them.
    machine_temp = tmp_path / "temp"
    monkeypatch.setattr(tempfile, "tempdir", str(machine_temp))
    others = [machine_temp / "chunks" / "chunk-0-0.bin", machine_temp / "data" / "image.jpg"]
    for staged in others:
        staged.parent.mkdir(parents=True)
        staged.write_bytes(b"another shard command's")
    shard(monkeypatch, tiny_shapes, tmp_path / "shards")
    assert all(staged.read_bytes() == b"another shard command's" for staged in others)
    assert sorted(path.name for path in machine_temp.iterdir()) == ["chunks", "data"]  # its own folder is gone
    assert len(stored(tmp_path / "shards", "train")) == 72


def test_fit_streams_and_every_validation_image_counts_once(monkeypatch, in_project_copy, shards, tiny_shapes):
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "{{ cookiecutter.package_name }}",
            "fit",
            *ON_CPU,
            *logged_to("runs"),
            *streaming(shards, batch_size=5, workers=2),
            "--data.image_size=32",
            "--data.crop_ratio=0.875",
            "--trainer.max_epochs=1",
        ],
    )
    main()
    logged = logged_metrics(in_project_copy)
    last = next(in_project_copy.glob("runs/run/*/checkpoints/last.ckpt"))
    assert_validation_by_hand(logged, ImageClassifier.load_from_checkpoint(last), tiny_shapes, 32, crop_ratio=0.875)
{%- if cookiecutter.inference == "yes" %}
    # What classify and export read: the streaming subclass's state too.
    assert checkpoint_preprocessing(torch.load(last, weights_only=True)).crop_ratio == 0.875
{%- endif %}

    # predict names each streamed test image by the file it was sharded from: the shards hold no such file.
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "predict", *ON_CPU, *logged_to("runs"),
                                      *streaming(shards, batch_size=5), f"--ckpt_path={last}"])  # fmt: skip
    main()
    with (last.parent.parent / "reports" / "predictions_test.csv").open(newline="") as file:
        paths = [row["path"] for row in csv.DictReader(file)]
    images = (tiny_shapes / "test").glob("*/*.png")
    assert paths == sorted(str(tiny_shapes.resolve() / path.relative_to(tiny_shapes)) for path in images)


def test_a_streaming_data_module_pickles(shards):
    # ddp_spawn pickles the trainer, and the data module with it.
    data = ImageDataModule(shards, format="streaming", num_workers=0)
    assert type(pickle.loads(pickle.dumps(data))) is type(data) is not ImageDataModule


def test_a_subclass_streams_only_as_a_subclass_of_the_streaming_module(shards):
    class MyFolders(ImageDataModule):
        """A user's data module for image folders."""

    class MyShards(StreamingDataModule):
        """A user's data module for shards."""

    with pytest.raises(ConfigError, match="MyFolders reads image folders: for --data.format streaming, subclass"):
        MyFolders(str(shards), format="streaming")
    assert type(MyShards(str(shards), format="streaming")) is MyShards
    assert type(ImageDataModule(str(shards), format="streaming")) is StreamingDataModule


def logged_metrics(project: Path) -> dict[str, float]:
    (metrics,) = (project / "runs" / "run").glob("*/metrics.csv")
    logged = {}
    for row in csv.DictReader(metrics.open()):
        logged |= {name: float(value) for name, value in row.items() if value and name.startswith("val/")}
    return logged


def assert_validation_by_hand(
    logged: dict[str, float], model: ImageClassifier, images: Path, size: int, **preprocessing: float
) -> None:
    folders = ImageDataModule(images, num_workers=0, batch_size=1000, image_size=size, **preprocessing)
    folders.setup("validate")
    batch, labels = folders.on_after_batch_transfer(next(iter(folders.val_dataloader())), 0)
    with torch.no_grad():
        expected = by_hand(model.eval()(batch).double(), labels, "val")
    assert set(logged) == set(expected)
    for name, value in expected.items():
        assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_two_processes_split_the_stream_and_count_every_validation_image_once(monkeypatch, in_project_copy,
                                                                                tiny_shapes, tmp_path):  # fmt: skip
    uneven = tmp_path / "uneven"  # 23 validation images: the processes' shares differ
    for path in tiny_shapes.glob("*/*/*.png"):
        (uneven / path.relative_to(tiny_shapes)).parent.mkdir(parents=True, exist_ok=True)
        (uneven / path.relative_to(tiny_shapes)).write_bytes(path.read_bytes())
    next((uneven / "val").glob("*/*.png")).unlink()
    shard(monkeypatch, uneven, tmp_path / "shards")
    trained = in_project_copy / "trained"
    fit_command(in_project_copy, "--config=configs/trainer/ddp.yaml", "--trainer.devices=2", "--trainer.max_epochs=1",
                *streaming(tmp_path / "shards", batch_size=4), *plain_images(), record(trained))  # fmt: skip
    logged = logged_metrics(in_project_copy)
    model = ImageClassifier.load_from_checkpoint(next(in_project_copy.glob("runs/run/*/checkpoints/last.ckpt")))
    assert_validation_by_hand(logged, model, uneven, 32)
    # Training: each process its own share, no image twice.
    per_rank = [seen_images(trained / f"trained{rank}.jsonl") for rank in (0, 1)]
    assert per_rank[0] and per_rank[1] and not set(per_rank[0]) & set(per_rank[1])


def test_shard_prints_its_own_lines_only(monkeypatch, capsys, tiny_shapes, tmp_path):
    shard(monkeypatch, tiny_shapes, tmp_path / "shards")
    printed = capsys.readouterr().out.splitlines()
    # Not LitData's status lines and its advert for its cloud ("Create an account on https://lightning.ai/").
    assert [line.split(":")[0] for line in printed[:-1]] == ["train", "val", "test"], printed
    assert printed[-1].startswith("Sharded 120 images of 6 classes")


def test_a_chunk_size_is_read_with_or_without_its_unit(monkeypatch, capsys, tiny_shapes, tmp_path):
    # LitData takes "64MB" but stopped on a byte count without its unit with a traceback of its workers.
    run_command(monkeypatch, "shard", str(tiny_shapes), str(tmp_path / "shards"), "--workers=1", "--chunk_bytes=20000")
    assert len(list((tmp_path / "shards" / "train").glob("chunk-*.bin"))) > 1
    capsys.readouterr()
    for size in ["64XB", "0", "MB"]:
        message = refusal(monkeypatch, capsys, "shard", str(tiny_shapes), str(tmp_path / "o"), f"--chunk_bytes={size}")
        assert f"a size is bytes as 64MB, 512kB or 300, got '{size}'" in message


def test_an_unreadable_image_in_shards_is_named_once_whichever_data_worker_reads_it(monkeypatch, tmp_path):
    # As in the folder format (test_data.py), and PIL's message named the address of the image's
    # bytes in memory, so each read of the one image was a new warning.
    with_broken_images(tmp_path / "images" / "train")
    make_folder(tmp_path / "images" / "val", {"cat": 1, "dog": 1})
    run_command(monkeypatch, "shard", str(tmp_path / "images"), str(tmp_path / "shards"), "--workers=1",
                "--chunk_bytes=300")  # fmt: skip
    epochs = f"""
from {{ cookiecutter.package_name }}.data import ImageDataModule
if __name__ == "__main__":
    data = ImageDataModule({str(tmp_path / "shards")!r}, format="streaming", num_workers=2, batch_size=4)
    data.setup("fit")
    loader = data.train_dataloader()  # each epoch shuffles which worker reads each chunk
    for epoch in range(6):
        list(loader)
"""
    (tmp_path / "epochs.py").write_text(epochs)
    command = [sys.executable, str(tmp_path / "epochs.py")]
    done = subprocess.run(command, capture_output=True, text=True, env=command_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # Named as the image folder holds it (no file of that path is in the shards' folder).
    named = re.findall(r"Skipping the unreadable image (\S+) in \S+, sharded from (\S+) \((.*)\)", done.stderr)
    images = str((tmp_path / "images").resolve())
    assert sorted(named) == [("train/cat/truncated.png", images, "image file is truncated"),
                             ("train/dog/garbage.jpg", images, "not an image format that torchvision or PIL reads")
                             ], done.stderr[-3000:]  # fmt: skip


def test_a_streamed_evaluation_batch_of_unreadable_images_alone_comes_empty(monkeypatch, tmp_path):
    # As in the folder format (test_data.py): an evaluation goes on past it, a training run stops.
    make_folder(tmp_path / "images" / "train", {"cat": 2, "dog": 2})
    with_broken_images(tmp_path / "images" / "val")
    run_command(monkeypatch, "shard", str(tmp_path / "images"), str(tmp_path / "shards"), "--workers=1")
    data = ImageDataModule(tmp_path / "shards", format="streaming", num_workers=0, batch_size=1, image_size=32)
    data.setup("validate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(data.val_dataloader())
    assert sorted(len(labels) for _, labels in batches) == [0, 0, *[1] * 8]
    assert {(images.shape[1:], images.dtype) for images, _ in batches} == {((3, 32, 32), torch.uint8)}


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a second file system: /dev/shm")
def test_shard_writes_to_another_file_system_than_the_temporary_folders(monkeypatch, capsys, tiny_shapes, tmp_path):
    # /tmp is often a tmpfs and the data disk not: nothing written in one can be renamed into the other.
    if Path("/dev/shm").stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("/dev/shm is on the same file system as the test's folder")
    elsewhere = tempfile.mkdtemp(dir="/dev/shm")
    monkeypatch.setattr(tempfile, "tempdir", elsewhere)
    try:
        shard(monkeypatch, tiny_shapes, tmp_path / "shards")
    finally:
        shutil.rmtree(elsewhere)
    assert capsys.readouterr().out.splitlines()[-1].startswith("Sharded 120 images of 6 classes")
    assert ImageDataModule(tmp_path / "shards", format="streaming").class_names == sorted(
        path.name for path in (tiny_shapes / "train").iterdir()
    )


def test_shard_into_a_folder_of_other_files_is_refused_and_into_its_own_goes_on(
    monkeypatch, capsys, tiny_shapes, tmp_path
):
    # LitData's overwrite deletes the .bin files of each split's folder, whoever wrote them.
    output = tmp_path / "work"
    (output / "train").mkdir(parents=True)
    (output / "train" / "weights.bin").write_bytes(b"mine")
    (output / "train" / ".DS_Store").write_text("Finder's")  # left alone by LitData, and by this check
    said = f"error: The output {output} holds files that LitData would delete and no shard run wrote (train/weights"
    assert refusal(monkeypatch, capsys, "shard", str(tiny_shapes), str(output)).startswith(said)
    assert (output / "train" / "weights.bin").read_bytes() == b"mine"
    shutil.rmtree(output)
    shard(monkeypatch, tiny_shapes, output)
    (output / MANIFEST).unlink()  # a run cut short
    shard(monkeypatch, tiny_shapes, output)
    assert json.loads((output / MANIFEST).read_text())["splits"]["train"]["images"] > 0


def test_a_folder_that_is_no_dataset_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"")
    assert "class folder" in refusal(monkeypatch, capsys, "shard", str(tmp_path / "flat"), str(tmp_path / "out"))
    assert "is not a folder" in refusal(monkeypatch, capsys, "shard", str(tmp_path / "none"), str(tmp_path / "out"))


def test_a_file_for_output_and_a_val_fraction_fit_refuses_are_refused_in_one_line(
    monkeypatch, capsys, tiny_shapes, tmp_path
):
    (tmp_path / "notes.txt").write_text("mine")
    said = refusal(monkeypatch, capsys, "shard", str(tiny_shapes), str(tmp_path / "notes.txt"))
    assert said == f"error: The output {tmp_path / 'notes.txt'} is a file: name a folder to write the shards into."
    output = str(tmp_path / "out")
    for fraction in ("1.5", "0"):  # a fit on such shards trained on 3 images, or validated on none
        said = refusal(monkeypatch, capsys, "shard", str(tiny_shapes), output, f"--val_fraction={fraction}")
        assert said == f"error: --val_fraction must be above 0 and below 1, got {float(fraction)}"
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "out").exists()


def test_ctrl_c_during_shard_stops_its_workers_and_says_so(tiny_shapes, tmp_path, groups):
    # LitData's own handler ended the command at once with status 0, as if every chunk were written
    # (`shard ... && fit ...` went on), and left its workers writing when the Ctrl-C reached it alone.
    many = tmp_path / "many"
    for index in range(400):  # hard links of the tiny images: enough for seconds of writing
        for image in (tiny_shapes / "train").glob("*/*.png"):
            (many / image.parent.name).mkdir(parents=True, exist_ok=True)
            (many / image.parent.name / f"{index}-{image.name}").hardlink_to(image)
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "shard", str(many), str(tmp_path / "out"),
               "--workers=2", "--chunk_bytes=20kB"]  # fmt: skip
    shard_command = groups(command, env=command_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert shard_command.stdout.readline().startswith("train: ")
    deadline = time.monotonic() + 60
    while not list((tmp_path / "out" / "train").glob("*.bin")) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the workers write
    shard_command.send_signal(signal.SIGINT)  # to the command alone, as `kill -INT` does
    _, stderr = shard_command.communicate(timeout=60)
    assert shard_command.returncode == 130, stderr[-3000:]
    # LitData's progress bar may print after it, as the process ends.
    assert "Stopped by Ctrl-C." in stderr.splitlines() and "Traceback" not in stderr
    time.sleep(1.0)
    chunks = sorted((tmp_path / "out" / "train").glob("*.bin"))
    time.sleep(2.0)
    assert sorted((tmp_path / "out" / "train").glob("*.bin")) == chunks, "a worker went on writing"
    assert not (tmp_path / "out" / MANIFEST).exists()


def test_a_split_option_that_streaming_cannot_apply_is_named(shards):
    with pytest.warns(UserWarning, match=r"data.val_fraction and data.split_seed: the shards hold the split that"):
        ImageDataModule(shards, format="streaming", val_fraction=0.5, split_seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ImageDataModule(shards, format="streaming")


def test_unfinished_shards_an_image_folder_and_another_class_set_are_refused(shards, tiny_shapes, tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "train").symlink_to(shards / "train")  # the chunks of a run cut short: no manifest yet
    with pytest.raises(MissingError, match="not a finished sharded dataset"):
        ImageDataModule(unfinished, format="streaming").class_names  # noqa: B018
    # Not to be sharded into itself, which shard refuses.
    with pytest.raises(MissingError, match=r"holds images, not shards: use --data.format folder, or shard them into"):
        ImageDataModule(tiny_shapes, format="streaming").class_names  # noqa: B018
    data = ImageDataModule(shards, format="streaming")
    with pytest.raises(DataError, match="classes"):
        data.load_state_dict({"class_names": ["cat", "dog"]})


def test_streaming_without_litdata_names_the_extra_to_install(monkeypatch, capsys, shards, tmp_path):
    monkeypatch.setitem(sys.modules, "litdata", None)  # as if it were not installed
    for module in ("datasets.streaming", "commands.shard"):
        monkeypatch.delitem(sys.modules, f"{{ cookiecutter.package_name }}.{module}", raising=False)
    assert ".[streaming]" in refusal(monkeypatch, capsys, "shard", str(tmp_path), str(tmp_path / "out"))
    assert ".[streaming]" in refusal(monkeypatch, capsys, "fit", *ON_CPU, *streaming(shards))


@pytest.fixture
def s3_bucket(monkeypatch) -> str:
    """A bucket on an S3-compatible server (moto) on 127.0.0.1, and the AWS_* variables that reach it."""
    moto_server = pytest.importorskip("moto.server")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    # AWS_ALLOW_HTTP: the local server speaks plain HTTP, which the S3 client refuses unless told.
    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ALLOW_HTTP": "true"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    boto3.client("s3").create_bucket(Bucket="data")
    yield "s3://data"
    server.stop()


def test_shard_into_s3_and_train_streaming_from_it(monkeypatch, in_project_copy, tiny_shapes, s3_bucket, tmp_path):
    shard(monkeypatch, tiny_shapes, f"{s3_bucket}/shapes")
    cache = tmp_path / "cache"
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "fit", *ON_CPU, *logged_to("runs"),
                                      *streaming(f"{s3_bucket}/shapes", batch_size=8), f"--data.cache_dir={cache}",
                                      "--trainer.max_epochs=1"])  # fmt: skip
    main()
    assert list(in_project_copy.glob("runs/run/*/checkpoints/last.ckpt"))
    assert list((cache / "train").glob("chunk-*.bin")) and list((cache / "val").glob("chunk-*.bin"))


def test_remote_data_without_credentials_is_refused_at_once(monkeypatch, capsys, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no probe of a cloud machine's metadata address
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *streaming("s3://data/shapes"))
    assert "No credentials for s3://data/shapes" in message and "AWS_ACCESS_KEY_ID" in message


def test_an_unreachable_store_is_refused_within_seconds(monkeypatch, capsys, tiny_shapes, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    assert "AWS_ALLOW_HTTP=true" in refusal(monkeypatch, capsys, "shard", str(tiny_shapes), "s3://data/shapes")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    started = time.monotonic()
    message = refusal(monkeypatch, capsys, "shard", str(tiny_shapes), "s3://data/shapes")
    assert "Cannot reach the storage endpoint" in message and "AWS_ENDPOINT_URL" in message
    assert time.monotonic() - started < 30
