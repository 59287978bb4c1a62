import hashlib
import json
import logging
import os
import struct
import sys

import pytest
import torch
import wandb
import yaml
from conftest import ON_CPU, on_data, refusal, run_cli
from wandb.proto import wandb_internal_pb2

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.training.wandb_logging import go_offline_unless_reachable

ONE_BATCH = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wandb_records(record) -> list:
    """The records of an offline W&B run, read from its run-<id>.wandb file as `wandb sync` reads it:
    protobuf records in 32 KiB blocks, each piece behind a 7-byte header (checksum, length, type)."""
    data, block, position = record.read_bytes(), 32768, 7  # after the file's own 7-byte header
    records, pieces = [], b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # too little room left for a header: the block is padded
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(pieces))
            pieces = b""
    return records


def wandb_config(record) -> dict:
    config = {}
    for parsed in wandb_records(record):
        if parsed.WhichOneof("record_type") == "config":
            config |= {item.key: json.loads(item.value_json) for item in parsed.config.update}
    return config


def wandb_history(record) -> list[dict]:
    """Each row that the run logged, by key."""
    rows = [parsed.history.item for parsed in wandb_records(record) if parsed.WhichOneof("record_type") == "history"]
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in row} for row in rows]


@pytest.fixture
def no_wandb_settings(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))


def test_no_api_key_goes_offline_and_says_so(no_wandb_settings, caplog):
    with caplog.at_level(logging.INFO):
        go_offline_unless_reachable("experiments/mine/part0")  # a folder of runs other than runs/
    assert os.environ["WANDB_MODE"] == "offline"
    assert "W&B logs offline: no API key" in caplog.text
    assert "Upload later with `wandb sync experiments/mine/part0/wandb/offline-run-*`" in caplog.text


def test_a_run_with_another_logger_says_nothing_of_wandb(no_wandb_settings, monkeypatch, caplog, in_project_copy,
                                                         tiny_shapes):  # fmt: skip
    with caplog.at_level(logging.INFO):
        run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), "--trainer.fast_dev_run=true",
                "--trainer.logger=lightning.pytorch.loggers.CSVLogger")  # fmt: skip
    assert "W&B" not in caplog.text and "WANDB_MODE" not in os.environ


def test_wandb_after_another_logger_goes_offline_too(no_wandb_settings, monkeypatch, caplog, in_project_copy,
                                                     tiny_shapes):  # fmt: skip
    loggers = [{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
               {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"save_dir": "runs"}}]  # fmt: skip
    data = on_data(tiny_shapes)
    with caplog.at_level(logging.INFO):
        run_cli(monkeypatch, "fit", *ON_CPU, *data, *ONE_BATCH, f"--trainer.logger={json.dumps(loggers)}")
    assert "W&B logs offline: no API key" in caplog.text and os.environ["WANDB_MODE"] == "offline"


def test_unreachable_server_goes_offline_instead_of_hanging(no_wandb_settings, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    with caplog.at_level(logging.INFO):
        go_offline_unless_reachable("runs")
    assert os.environ["WANDB_MODE"] == "offline"
    assert "wandb.invalid cannot be reached" in caplog.text


def test_explicit_mode_is_left_alone(no_wandb_settings, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    go_offline_unless_reachable("runs")
    assert os.environ["WANDB_MODE"] == "disabled"


def test_a_mode_wandb_refuses_is_one_error_line_before_the_run(no_wandb_settings, monkeypatch, capsys, in_project_copy,
                                                               tiny_shapes):  # fmt: skip
    # W&B's own refusal came as the run started, in a pydantic traceback.
    monkeypatch.setenv("WANDB_MODE", "bogus")
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(tiny_shapes), *ONE_BATCH)
    assert message == "error: WANDB_MODE=bogus is no W&B mode: set it to online, offline or disabled, or unset it"
    assert not (in_project_copy / "runs").exists()
    for mode in ("online", "offline", "disabled"):  # each a mode the message names
        assert wandb.Settings(mode=mode).mode == mode


def test_each_run_keeps_its_config_in_its_folder_and_in_its_wandb_record(monkeypatch, in_project_copy, tiny_shapes):
    # An absolute runs/: the W&B service, started by an earlier test, writes the record from its own folder.
    runs = f"--trainer.logger.save_dir={in_project_copy / 'runs'}"
    for lr in (0.001, 0.003):
        argv = ["fit", *ON_CPU, *ONE_BATCH, *on_data(tiny_shapes), runs, f"--model.lr={lr}"]
        monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *argv])
        main()
        wandb.finish()  # what the end of a process does between two real runs
    configs = list((in_project_copy / "runs").glob("*/*/config.yaml"))  # runs/<project>/<run>/
    assert sorted(yaml.safe_load(config.read_text())["model"]["lr"] for config in configs) == [0.001, 0.003]
    for config in configs:
        run_id = config.parent.name
        (record,) = (in_project_copy / "runs" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
        saved, logged = yaml.safe_load(config.read_text()), wandb_config(record)["config"]
        assert logged["seed_everything"] == saved["seed_everything"]
        for section in ("model", "data"):  # the record also holds what links fill in (model.batch_size, ...)
            assert {name: logged[section][name] for name in saved[section]} == saved[section]


def test_the_confusion_matrix_is_logged_at_the_step_of_its_validation_metrics(
    monkeypatch, in_project_copy, tiny_shapes
):
    runs = f"--trainer.logger.save_dir={in_project_copy / 'runs'}"  # absolute: see the test above
    run_cli(monkeypatch, "fit", *ON_CPU, *ONE_BATCH, *on_data(tiny_shapes), runs)
    wandb.finish()
    (record,) = (in_project_copy / "runs" / "wandb").glob("offline-run-*/run-*.wandb")
    rows = wandb_history(record)
    (image,) = (row["trainer/global_step"] for row in rows if "val/confusion_matrix/_type" in row)
    (metrics,) = (row["trainer/global_step"] for row in rows if "val/acc" in row)
    assert image == metrics == 0, rows  # one step taken: Lightning logs its validation at that step's index


def test_a_run_config_from_before_the_logger_listed_its_options_names_those_to_delete(
    monkeypatch, capsys, in_project_copy
):
    # Its logger block holds every option of Lightning's WandbLogger and of wandb.init, most of them null.
    logger = "{{ cookiecutter.package_name }}.training.wandb_logging.BestModelWandbLogger"
    (in_project_copy / "old.yaml").write_text(
        f"trainer:\n  logger:\n    class_path: {logger}\n"
        "    init_args: {project: x, save_dir: runs, dir: null, experiment: null, settings: null}\n"
    )
    message = refusal(monkeypatch, capsys, "fit", "--config=old.yaml", "--trainer.fast_dev_run=true")
    stale = "old.yaml: BestModelWandbLogger takes no dir, experiment, settings"
    assert message == f"error: {stale}: correct or delete them in the config"


def test_runs_with_another_logger_still_save_their_config(monkeypatch, in_project_copy, tiny_shapes):
    csv_logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=runs"]
    on_cpu = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32-true"]
    data = [f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.num_workers=0"]
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "fit", *csv_logger, *on_cpu, *ONE_BATCH, *data])
    main()
    (config,) = (in_project_copy / "runs").rglob("config.yaml")
    assert (config.parent / "checkpoints" / "last.ckpt").is_file()


def test_log_model_keeps_the_best_checkpoint_for_wandb_sync(monkeypatch, in_project_copy, tiny_shapes, tmp_path):
    # Offline, W&B copies each logged file into its data folder, from which `wandb sync` uploads it.
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    two_epochs = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]
    # An absolute runs/: the W&B service, started by an earlier test, resolves paths from its own folder.
    logger = [f"--trainer.logger.save_dir={in_project_copy / 'runs'}", "--trainer.logger.log_model=true"]
    argv = ["fit", *ON_CPU, *two_epochs, *on_data(tiny_shapes), *logger]
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *argv])
    main()
    wandb.finish()

    (checkpoints,) = (in_project_copy / "runs").glob("*/*/checkpoints")
    (best,) = checkpoints.glob("epoch*.ckpt")
    staged = [path for path in (tmp_path / "wandb-data" / "artifacts" / "staging").iterdir() if path.is_file()]
    assert [digest(path) for path in staged] == [digest(best)], "the best checkpoint alone, not last.ckpt"
    run_id = checkpoints.parent.name
    (record,) = (in_project_copy / "runs" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    logged = record.read_bytes()  # the artifact's name and its file's original name, as sync will send them
    assert f"model-{run_id}".encode() in logged and best.name.encode() in logged and b"last.ckpt" not in logged


def test_log_model_says_that_sharded_checkpoints_are_not_uploaded(monkeypatch, in_project_copy, tiny_shapes, tmp_path):
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    fsdp2_on_one_cpu = ["--config=configs/trainer/fsdp.yaml", *ON_CPU[:2], "--trainer.precision=32-true"]
    argv = ["fit", *fsdp2_on_one_cpu, *ONE_BATCH, *on_data(tiny_shapes), "--trainer.logger.log_model=true"]
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *argv])
    try:
        with pytest.warns(UserWarning, match="checkpoints are folders of shards, which W&B's logger does not upload"):
            main()
    finally:  # the one-process group FSDP2 made would outlive the test
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
