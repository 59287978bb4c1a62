"""One set of hardware rules, and every user of it agreeing: the CLI's refusal, doctor, the smoke
test's fallback and the template's generation check, for every preset, accelerator and precision."""

import itertools
from dataclasses import replace

import pytest
import yaml
from conftest import PROJECT_ROOT

from {{ cookiecutter.package_name }}.commands import doctor
from {{ cookiecutter.package_name }}.hardware import checks
from {{ cookiecutter.package_name }}.hardware.rules import Settings, fastest_precision, from_trainer, problems, runnable

PRESETS = sorted((PROJECT_ROOT / "configs" / "trainer").glob("*.yaml"))
BASE = {"python": "3.12", "torch": "2.9", "cuda": None, "cudnn": None, "nccl": None, "gpus": [], "mps": False}
BASE |= {"cpus": 8, "deepspeed": True}
H100 = {"name": "NVIDIA H100", "capability": "9.0", "memory_gib": 79.1, "bf16": True, "tf32": True}
V100 = {"name": "Tesla V100-SXM2-32GB", "capability": "7.0", "memory_gib": 31.7, "bf16": False, "tf32": False}
MACHINES = {
    "cpu only": BASE,
    "cuda build, no gpu": BASE | {"cuda": "12.8", "cudnn": "9.1.0"},
    "apple silicon": BASE | {"mps": True, "deepspeed": False},
    "one v100": BASE | {"cuda": "12.8", "cudnn": "9.1.0", "nccl": "2.21.5", "gpus": [V100]},
    "eight h100": BASE | {"cuda": "12.8", "cudnn": "9.1.0", "nccl": "2.21.5", "gpus": [H100] * 8},
    "bare h100": BASE | {"cuda": "12.8", "gpus": [H100] * 2, "deepspeed": False},
}
CASES = list(itertools.product(PRESETS, ["auto", "gpu", "cpu", "mps"], ["bf16-mixed", "16-mixed", "32-true"]))


def trainer_of(preset, accelerator: str, precision: str) -> dict:
    return yaml.safe_load(preset.read_text())["trainer"] | {"accelerator": accelerator, "precision": precision}


@pytest.mark.parametrize("machine_name", MACHINES)
def test_every_user_of_the_rules_agrees(monkeypatch, project_config, machine_name):
    facts = MACHINES[machine_name]
    machine = checks.machine_of(facts)
    monkeypatch.setattr(checks, "machine_facts", lambda: facts)
    refused = 0
    for preset, accelerator, precision in CASES:
        trainer = trainer_of(preset, accelerator, precision)
        case = f"{preset.stem} {accelerator} {precision} on {machine_name}"
        settings = from_trainer(trainer)
        found = problems(settings, machine)
        refused += bool(found)

        # The CLI stops at the first problem, with its fix.
        if found:
            with pytest.raises(checks.HardwareError) as stopped:
                checks.check_hardware(trainer)
            assert str(stopped.value) == f"{found[0]}.", case
        else:
            checks.check_hardware(trainer)

        # doctor fails exactly on these, in this order.
        config = {"trainer": trainer, "data": project_config["data"]}
        failed = [(check.what, check.fix) for check in doctor.checks(facts, config) if check.verdict == "fail"]
        assert failed == [(problem.what, problem.fix) for problem in found], case

        # The smoke test runs the settings as they are (in the CPU's fastest precision), or settings this machine runs.
        ran, why = runnable(settings, machine)
        assert problems(ran, machine) == [], case
        fastest, slower = fastest_precision(settings, machine)
        assert (ran == replace(settings, precision=fastest)) is (not found), case
        assert why == (found[0].what if found else slower), case

        # What the generation check refuses, knowing no machine, is refused on every machine.
        assert {p.what for p in problems(settings)} <= {p.what for p in found}, case
    assert 0 < refused < len(CASES), "the machines should both run and refuse some settings"


@pytest.mark.parametrize(
    ("settings", "machine_name", "said"),
    [
        # Lightning runs float16 AMP on Apple's GPUs (autocast and a GradScaler on mps).
        (Settings("mps", 1, "auto", "16-mixed"), "apple silicon", None),
        (Settings("mps", 1, "auto", "16-mixed"), "cpu only", "Apple's MPS backend is not available"),
        (Settings("auto", 2, "DDPStrategy", "32-true"), "apple silicon", "MPS backend trains on one device"),
        (Settings("gpu", "auto", "FSDPStrategy", "16-mixed"), "eight h100", None),
        (Settings("gpu", 8, "DDPStrategy", "bf16-mixed"), "one v100", "devices 8, but 1 CUDA GPU(s)"),
        (Settings("gpu", 1, "FSDP2Strategy", "bf16-mixed"), "one v100", "needs NVIDIA GPUs of compute capability 8.0"),
        (Settings("auto", 1, "DeepSpeedStrategy", "bf16-mixed"), "cpu only", "DeepSpeed runs on NVIDIA GPUs only"),
        (Settings("gpu", 2, "DeepSpeedStrategy", "bf16-mixed"), "bare h100", "DeepSpeed is not installed"),
        (Settings("gpu", 2, "DDPStrategy", "bf16-mixed"), "bare h100", "needs NCCL"),
        (Settings("auto", "[0, 1]", "DDPStrategy", "16-mixed"), "cpu only", "float16 autocast for GPUs"),
        (Settings("cpu", "auto", "DDPStrategy", "32-true"), "eight h100", "data parallel on the CPU with devices auto"),
        (Settings("cpu", "auto", "FSDP2Strategy", "32-true"), "cpu only", "FSDP2 on the CPU with devices auto starts"),
        (Settings("auto", "auto", "DDPStrategy", "32-true"), "cpu only", "data parallel on the CPU with devices auto"),
        (Settings("cpu", 1, "DDPStrategy", "32-true"), "cpu only", None),  # one process, as asked: a test's twin
    ],
)
def test_rules(settings, machine_name, said):
    found = problems(settings, checks.machine_of(MACHINES[machine_name]))
    assert (said in found[0].what) if said else found == [], found


def test_a_multi_process_preset_without_gpus_says_how_to_try_it_in_cpu_processes():
    machine = checks.machine_of(MACHINES["cpu only"])
    cpu_processes = "two CPU processes, --trainer.accelerator cpu --trainer.devices 2 --trainer.precision 32-true)"
    for precision in ("bf16-mixed", "16-mixed"):
        fixes = [problem.fix for problem in problems(Settings("gpu", "auto", "DDPStrategy", precision), machine)]
        assert any(fix.endswith(cpu_processes) for fix in fixes), fixes
    assert problems(Settings("cpu", 2, "DDPStrategy", "32-true"), machine) == []  # the fix runs
    fixes = [problem.fix for problem in problems(Settings("gpu", 1, "auto", "bf16-mixed"), machine)]
    assert fixes and not any("CPU processes" in fix for fix in fixes)


def test_too_many_devices_fall_back_to_the_gpus_there_are():
    machine = checks.machine_of(MACHINES["one v100"])
    ran, why = runnable(Settings("gpu", 4, "DDPStrategy", "16-mixed"), machine)
    assert ran == Settings("gpu", "1", "DDPStrategy", "16-mixed") and why == "devices 4, but 1 CUDA GPU(s) are visible"


def test_the_cpu_preset_trains_in_float32_on_a_cpu_that_computes_bfloat16(monkeypatch):
    # As the precision prompt says, whatever the answer: --trainer.precision bf16-mixed asks for it.
    monkeypatch.setattr(checks, "machine_facts", lambda: MACHINES["cpu only"] | {"cpu_bf16": True})
    trainer = yaml.safe_load((PROJECT_ROOT / "configs/trainer/cpu.yaml").read_text())["trainer"]
    checks.settle_precision(trainer)
    assert trainer["precision"] == "32-true"


@pytest.mark.parametrize(
    ("machine_name", "accelerator", "cpu_bf16", "amx", "trained_in"),
    [
        ("cpu only", "auto", False, False, "32-true"),  # emulated bfloat16: float32 instead
        ("cpu only", "cpu", False, False, "32-true"),
        ("cpu only", "auto", True, False, "bf16-mixed"),  # AVX-512 BF16 (an AMD EPYC): 1.5x as fast as float32
        ("cpu only", "auto", True, True, "32-true"),  # AMX (a Xeon): autocast measured slower than float32
        ("cpu only", "cpu", True, True, "bf16-mixed"),  # put on the CPU on purpose: as configured
        ("eight h100", "auto", False, False, "bf16-mixed"),  # on the GPUs, whatever the CPU does
    ],
)
def test_the_cpu_trains_in_its_fastest_precision(monkeypatch, machine_name, accelerator, cpu_bf16, amx, trained_in):
    facts = MACHINES[machine_name] | {"cpu_bf16": cpu_bf16, "cpu_amx": amx}
    monkeypatch.setattr(checks, "machine_facts", lambda: facts)
    trainer = {"accelerator": accelerator, "devices": 1, "strategy": "auto", "precision": "bf16-mixed"}
    checks.settle_precision(trainer)
    assert trainer["precision"] == trained_in
    ran, _ = runnable(Settings("gpu", 1, "auto", "bf16-mixed"), checks.machine_of(facts))
    if not facts["gpus"]:  # no GPU: the smoke test falls back to the CPU, as a run that lands there
        assert ran.precision == ("bf16-mixed" if cpu_bf16 and not amx else "32-true")
        float16 = runnable(Settings("gpu", 1, "auto", "16-mixed"), checks.machine_of(facts))[0]
        assert float16.precision == "32-true"  # float16 autocast is emulated on a CPU
