import json
import sys
from collections import namedtuple

import pytest
from conftest import command_env, run_group

from {{ cookiecutter.package_name }} import backbone
from {{ cookiecutter.package_name }}.cli import main, resolved_config
from {{ cookiecutter.package_name }}.commands import doctor

NO_GPU = {"python": "3.11", "torch": "2.5", "cuda": None, "cudnn": None, "nccl": None, "gpus": [], "mps": False}
NO_GPU |= {"cpus": 4, "deepspeed": False}
GPU = {"name": "Tesla V100", "capability": "7.0", "memory_gib": 32.0, "bf16": False, "tf32": False}


@pytest.fixture(scope="module")
def data(project_config) -> dict:
    return project_config["data"]


def config(data: dict | None = None, **trainer) -> dict:
    trainer = {"accelerator": "cpu", "precision": "32-true", "strategy": "auto"} | trainer
    return {"trainer": trainer, "data": data or {"num_workers": 0}}


def failures(facts: dict, settings: dict) -> list[doctor.Check]:
    return [check for check in doctor.checks(facts, settings) if check.verdict == "fail"]


def test_a_cpu_config_on_a_cpu_machine_passes():
    assert failures(NO_GPU, config()) == []


def test_the_precision_is_the_one_fit_trains_in():
    def precision_line(facts: dict, **trainer) -> str:
        checks = doctor.checks(facts, config(**trainer))
        (line,) = [check.what for check in checks if check.what.startswith("precision")]
        return line

    # bf16-mixed (the default) on a machine without a GPU, with AMX: fit trains in 32-true, and says why.
    assert precision_line(NO_GPU | {"cpu_amx": True}, accelerator="auto", precision="bf16-mixed").startswith(
        "precision 32-true for the configured bf16-mixed (bfloat16 autocast was measured slower than float32 on a"
    )
    assert precision_line(NO_GPU, accelerator="auto", precision="bf16-mixed") == "precision bf16-mixed, strategy auto"
    assert precision_line(NO_GPU | {"cpu_bf16": False}, precision="bf16-mixed").startswith(
        "precision 32-true for the configured bf16-mixed (this CPU lacks bfloat16 arithmetic"
    )
    assert precision_line(NO_GPU, precision="bf16-mixed") == "precision bf16-mixed, strategy auto"


def test_gpu_without_cuda_device_fails_with_a_fix():
    (failure,) = failures(NO_GPU, config(accelerator="gpu"))
    assert "no CUDA GPU is visible" in failure.what and "torch with CUDA" in failure.fix


def test_more_devices_than_gpus_fails():
    facts = NO_GPU | {"cuda": "12.4", "nccl": "2.21.5", "gpus": [GPU | {"bf16": True}] * 2}
    (failure,) = failures(facts, config(accelerator="gpu", devices=4))
    assert "2 CUDA GPU(s)" in failure.what and "--trainer.devices 2" in failure.fix


def test_bf16_on_a_gpu_without_it_fails():
    facts = NO_GPU | {"cuda": "12.4", "gpus": [GPU]}
    (failure,) = failures(facts, config(accelerator="gpu", precision="bf16-mixed"))
    assert "16-mixed" in failure.fix


def test_fp16_on_cpu_fails():
    (failure,) = failures(NO_GPU, config(precision="16-mixed"))
    assert "float16 autocast for GPUs" in failure.what


def test_too_many_workers_warn(data):
    settings = config(data | {"num_workers": 8}, devices=2)
    warnings = [c for c in doctor.checks(NO_GPU, settings) if c.verdict == "warn"]
    assert any("exceed the 4 CPUs" in c.what for c in warnings)


def test_small_shared_memory_warns(monkeypatch, data):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: Usage(64 * 2**20, 0, 64 * 2**20))
    settings = config(data | {"num_workers": 2, "image_size": 224, "batch_size": 128})
    warnings = [c for c in doctor.checks(NO_GPU, settings) if c.verdict == "warn"]
    assert any("/dev/shm" in c.what and "--shm-size" in c.fix for c in warnings)


def test_options_a_config_leaves_out_are_the_data_modules_defaults(monkeypatch, in_project_copy):
    side = {{ cookiecutter.image_size }}  # the data module's default image size; the config leaves it out
    needed = 2 * 2 * 64 * 3 * side * side * 4  # 2 workers x 2 prefetched batches of 64 float images
    # Room for the default size, not for the 224 px that doctor used to assume in its place.
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: Usage(3 * needed, 0, 3 * needed))
    (in_project_copy / "mine.yaml").write_text("data:\n  num_workers: 2\n")
    settings = resolved_config(["--config=mine.yaml"])  # as doctor --config mine.yaml reads it
    assert settings["data"]["image_size"] == side and settings["data"]["batch_size"] == 64
    (shared_memory,) = [c for c in doctor.checks(NO_GPU, settings) if "/dev/shm" in c.what]
    assert shared_memory.verdict == "ok", shared_memory


def test_doctor_command_reports_this_machine_as_json(monkeypatch, capsys, tmp_path):
    (tmp_path / "cpu.yaml").write_text("trainer:\n  accelerator: cpu\n  precision: 32-true\n")
    args = ["doctor", "--json", "--config", str(tmp_path / "cpu.yaml")]
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *args])
    with pytest.raises(SystemExit) as exit:
        main()
    report = json.loads(capsys.readouterr().out)
    assert exit.value.code == 0
    assert report["machine"]["torch"] and report["machine"]["cpus"] >= 1
    assert {check["verdict"] for check in report["checks"]} <= {"ok", "info", "warn"}


def test_the_data_is_checked_as_fit_reads_it(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # Every line said ok for a data folder that does not exist; only fit found out.
    def doctor_says(*options: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "doctor", *options])
        with pytest.raises(SystemExit) as stopped:
            main()
        (line,) = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith(("ok", "fail"))
                   and "  data: " in line]  # fmt: skip
        return stopped.value.code, line

    (in_project_copy / "mine.yaml").write_text(f"data:\n  data_dir: {in_project_copy / 'nowhere'}\n")
    code, line = doctor_says("--config=mine.yaml")
    assert code == 1 and line.startswith(f" fail  data: Data folder {in_project_copy / 'nowhere'} does not exist")
    (in_project_copy / "mine.yaml").write_text(f"data:\n  data_dir: {tiny_shapes}\n  synthetic: false\n")
    code, line = doctor_says("--config=mine.yaml")
    assert code in (0, None) and line.startswith("   ok  data: 72 training and 24 validation image files in 6 classes")


def test_pretrained_weights_neither_cached_nor_within_reach_fail(monkeypatch, capsys, in_project_copy, tmp_path):
    # Every line said ok, and fit then stopped: the weights could not be downloaded.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(backbone, "reachable", lambda host: False)
    (in_project_copy / "tuned.yaml").write_text("model:\n  backbone: resnet18\n  pretrained: true\n")
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "doctor", "--config=tuned.yaml"])
    with pytest.raises(SystemExit) as stopped:
        main()
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "pretrained resnet18 weights" in line]
    assert stopped.value.code == 1 and line.startswith(" fail  The pretrained resnet18 weights are not in the cache")
    assert f"put it at {tmp_path / 'hub' / 'checkpoints' / 'resnet18-f37072fd.pth'}" in line
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth").touch()
    assert doctor.weights_check("resnet18").verdict == "ok"


{%- if cookiecutter.logger == "wandb" %}


def test_the_w_and_b_loggers_package_missing_fails(monkeypatch, project_config):
    # Every check passed, and fit then stopped at the logger's start.
    find_spec = doctor.importlib.util.find_spec
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None if name == "wandb" else find_spec(name))
    wandb = config(logger=project_config["trainer"]["logger"])
    assert [check.what for check in failures(NO_GPU, wandb)] == ["wandb, the W&B logger's package, is not installed"]
    assert failures(NO_GPU, config(logger={"class_path": "lightning.pytorch.loggers.CSVLogger"})) == []


def test_a_wandb_mode_wandb_refuses_fails(monkeypatch, project_config):
    # The smoke test trains with the CSV logger, and passed; fit then ended in W&B's traceback.
    monkeypatch.setenv("WANDB_MODE", "bogus")
    wandb = config(logger=project_config["trainer"]["logger"])
    assert [(check.what, check.fix) for check in failures(NO_GPU, wandb)] == [
        ("WANDB_MODE=bogus is no W&B mode", "set it to online, offline or disabled, or unset it")
    ]
{%- endif %}


def test_a_config_that_does_not_parse_is_one_error_line(monkeypatch, capsys, in_project_copy):
    (in_project_copy / "typo.yaml").write_text("data:\n  batch_sise: 2\n")
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "doctor", "--config=typo.yaml"])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert str(stopped.value.code).startswith("error: ") and "data.batch_size" in str(stopped.value.code)


def test_a_deepspeed_preset_is_read_whatever_deepspeed_logs_on_import(in_project_copy):
    # DeepSpeed, imported while the configuration is read, logs a line to stdout ahead of it: in a
    # fresh process, as a user's doctor runs, that line used to end doctor in a YAML traceback.
    pytest.importorskip("deepspeed")
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "doctor", "--json",
               "--config=configs/trainer/deepspeed_stage2.yaml"]  # fmt: skip
    done = run_group(command, 300, cwd=in_project_copy, env=command_env())
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["machine"]["deepspeed"] and report["checks"]
