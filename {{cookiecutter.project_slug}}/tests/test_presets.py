"""Every trainer preset parses, builds its strategy, and stops in one line where the hardware is missing."""

import importlib
import inspect
from datetime import timedelta
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import PROJECT_ROOT, run_cli
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import Strategy

from {{ cookiecutter.package_name }}.cli import DEFAULT_CONFIGS
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.hardware import checks, rules
from {{ cookiecutter.package_name }}.hardware.sharding import wrap_blocks
from {{ cookiecutter.package_name }}.model import ImageClassifier

PRESETS = sorted((PROJECT_ROOT / "configs" / "trainer").glob("*.yaml"))
HARDWARE_KEYS = {"accelerator", "devices", "num_nodes", "strategy", "precision", "sync_batchnorm"}


def trainer_section(preset: Path) -> dict:
    return yaml.safe_load(preset.read_text())["trainer"]


def test_the_default_config_starts_from_a_preset():
    assert DEFAULT_CONFIGS[0].parent == Path("configs/trainer")
    assert (PROJECT_ROOT / DEFAULT_CONFIGS[0]).is_file()
    recipe = yaml.safe_load((PROJECT_ROOT / DEFAULT_CONFIGS[1]).read_text())["trainer"]
    assert not HARDWARE_KEYS & recipe.keys(), "the recipe would override the preset's hardware"


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.stem)
def test_preset_sets_all_the_hardware_and_parses(monkeypatch, capsys, in_project_copy, preset):
    # Each preset sets every hardware key, so one composed after another replaces it whole.
    assert trainer_section(preset).keys() >= HARDWARE_KEYS
    with pytest.raises(SystemExit) as done:
        run_cli(monkeypatch, "fit", f"--config={preset}", "--print_config")
    assert done.value.code == 0
    # Composed over the default preset and the recipe, the preset's hardware is what stands. What is
    # printed is the config alone, to be saved as a file (DeepSpeed announced its CPU fallback there).
    printed, wanted = yaml.safe_load(capsys.readouterr().out)["trainer"], trainer_section(preset)
    for key in HARDWARE_KEYS - {"strategy"}:
        assert printed[key] == wanted[key], key
    if isinstance(wanted["strategy"], dict):
        assert printed["strategy"]["class_path"] == wanted["strategy"]["class_path"]
        assert printed["strategy"]["init_args"].items() >= wanted["strategy"]["init_args"].items()
    else:
        assert printed["strategy"] == wanted["strategy"]


def test_presets_of_one_strategy_class_set_the_same_options():
    # jsonargparse merges the init_args of a strategy class given twice, so an option only one of
    # them sets would outlive a switch to the other (stage 2 offloading after stage 3's, say).
    options: dict[str, set[str]] = {}
    for preset in PRESETS:
        strategy = trainer_section(preset)["strategy"]
        if isinstance(strategy, dict):
            keys = set(strategy.get("init_args", {}))
            assert options.setdefault(strategy["class_path"], keys) == keys, preset.name


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.stem)
def test_preset_builds_its_strategy(preset):
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy | str)
    config = parser.parse_object({"strategy": trainer_section(preset)["strategy"]})
    if "deepspeed" in preset.stem and find_spec("deepspeed") is None:
        with pytest.raises(Exception, match="pip install"):
            parser.instantiate(config)
        return
    strategy = parser.instantiate(config).strategy
    expected = {"fsdp": "FSDP2Strategy", "fsdp1": "FSDPStrategy", "ddp": "DDPStrategy", "multinode": "DDPStrategy"}
    expected |= {"deepspeed_stage2": "DeepSpeedStrategy", "deepspeed_stage3_offload": "DeepSpeedStrategy"}
    name = type(strategy).__name__ if isinstance(strategy, Strategy) else strategy
    assert name == expected.get(preset.stem, "auto")
    if isinstance(strategy, Strategy):  # a lost or hung peer ends the run in 10 minutes, not 30
        assert strategy._timeout == timedelta(minutes=10)
    if preset.stem == "fsdp1":  # the policy given by its import path arrives as the function
        assert strategy.kwargs["auto_wrap_policy"] is wrap_blocks
    if name == "DeepSpeedStrategy":  # offloading needs DeepSpeed's CPU Adam, which the model then builds
        model = ImageClassifier(num_classes=3)
        model._trainer = SimpleNamespace(strategy=strategy)
        assert model._offloads_optimizer() == ("offload" in preset.stem)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("preset", ["fsdp1", "deepspeed_stage2", "deepspeed_stage3_offload"])
@pytest.mark.parametrize("accelerator", ["gpu", "cpu"])
def test_cuda_only_presets_stop_in_one_line_before_any_work(monkeypatch, in_project_copy, preset, accelerator):
    with pytest.raises(SystemExit) as stopped:
        run_cli(monkeypatch, "fit", f"--config=configs/trainer/{preset}.yaml", f"--trainer.accelerator={accelerator}")
    message = str(stopped.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert "NVIDIA GPUs only" in message and "configs/trainer/ddp.yaml" in message
    assert not (in_project_copy / "data").exists() and not (in_project_copy / "runs").exists()


def test_fp16_on_the_cpu_is_refused(monkeypatch, in_project_copy):
    with pytest.raises(SystemExit, match="bf16-mixed or 32-true"):
        run_cli(monkeypatch, "fit", "--config=configs/trainer/cpu.yaml", "--trainer.precision=16-mixed")


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    v100 = {"name": "Tesla V100-SXM2-32GB", "capability": "7.0", "memory_gib": 32.0, "bf16": False, "tf32": False}
    facts = checks.machine_facts() | {"cuda": "12.4", "nccl": "2.21.5", "gpus": [v100]}
    monkeypatch.setattr(checks, "machine_facts", lambda: facts)
    with pytest.raises(checks.HardwareError, match="Tesla V100.*16-mixed"):
        checks.check_hardware({"accelerator": "gpu", "precision": "bf16-mixed", "strategy": "auto"})
    checks.check_hardware({"accelerator": "gpu", "precision": "16-mixed", "strategy": "ddp"})
    fsdp2 = {"class_path": "{{ cookiecutter.package_name }}.hardware.sharding.FSDP2Strategy"}
    with pytest.raises(checks.HardwareError, match="use --trainer.precision 32-true"):  # FSDP2 has no 16-mixed
        checks.check_hardware({"accelerator": "gpu", "precision": "bf16-mixed", "strategy": fsdp2})


def test_fsdp2_with_float16_is_refused_and_its_preset_never_asks_for_it(monkeypatch, in_project_copy):
    # Whatever precision the project was generated with, the FSDP2 preset holds one that FSDP2 runs.
    assert yaml.safe_load((in_project_copy / "configs/trainer/fsdp.yaml").read_text())["trainer"]["precision"] in (
        "bf16-mixed", "32-true")  # fmt: skip
    with pytest.raises(SystemExit, match="FSDP2 .* has no float16 loss scaling"):
        run_cli(monkeypatch, "fit", "--config=configs/trainer/fsdp.yaml", "--trainer.precision=16-mixed")


@pytest.mark.parametrize(
    ("strategy", "name"),
    [
        ("auto", "auto"),
        ("ddp", "DDPStrategy"),
        ("ddp_find_unused_parameters_true", "DDPStrategy"),
        ("fsdp", "FSDPStrategy"),
        ("deepspeed_stage_3_offload", "DeepSpeedStrategy"),
        ({"class_path": "lightning.pytorch.strategies.FSDPStrategy"}, "FSDPStrategy"),
    ],
)
def test_strategy_names_as_users_write_them(strategy, name):
    assert rules.strategy_class_name(strategy) == name


def own_defaults(cls) -> dict:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not p.empty}


def test_the_recipe_states_only_what_differs_from_the_signatures():
    # A default lives in its __init__ signature; a copy in the YAML would outvote an edit there.
    recipe = yaml.safe_load((PROJECT_ROOT / DEFAULT_CONFIGS[1]).read_text())
    sections = [(ImageClassifier, recipe.get("model") or {}), (ImageDataModule, recipe.get("data") or {})]
    for entry in [*recipe["trainer"]["callbacks"], *recipe["trainer"].get("plugins", []), recipe["trainer"]["logger"]]:
        module, _, name = entry["class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if module.startswith("{{ cookiecutter.package_name }}.") and "__init__" in vars(cls):  # signatures of ours
            sections.append((cls, entry.get("init_args") or {}))
    assert len(sections) >= 4
    for cls, values in sections:
        defaults = own_defaults(cls)
        repeated = {key: value for key, value in values.items() if key in defaults and defaults[key] == value}
        assert not repeated, f"configs/default.yaml repeats {cls.__name__}'s defaults {repeated}: leave them out"
