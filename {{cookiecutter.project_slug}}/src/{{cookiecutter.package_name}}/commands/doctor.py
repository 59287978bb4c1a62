"""`python -m {{ cookiecutter.package_name }} doctor`: is this machine ready to train this project?

One line per check: a verdict, what was found and, where it fails, the fix. `--json` prints the
same as data; `--smoke` then trains for a few batches (smoke_test.py), as the project's generation did.
"""

{% if cookiecutter.logger == "wandb" -%}
import importlib.util
{% endif -%}
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ..backbone import pretrained_weights_missing
from ..cli import resolved_config
from ..data import ImageDataModule, auto_workers
from ..errors import PACKAGE, CommandParser, UserError
from ..hardware.checks import machine_facts, machine_of
from ..hardware.rules import fastest_precision, from_trainer, problems, target
{%- if cookiecutter.logger == "wandb" %}
from ..training.resume import configured_loggers, is_wandb
from ..training.wandb_logging import has_api_key, wandb_mode_problem
{%- endif %}
from .smoke_test import smoke_test


@dataclass
class Check:
    verdict: str  # "ok", "warn", "fail" or "info"
    what: str
    fix: str = ""


def checks(facts: dict, config: dict) -> list[Check]:
    trainer, data = config["trainer"], config["data"]
    settings = from_trainer(trainer)
    found: list[Check] = [
        Check("info", f"Python {facts['python']}, torch {facts['torch']}"),
        Check("info", cuda_line(facts)),
    ]
    for index, gpu in enumerate(facts["gpus"]):
        found.append(
            Check(
                "info",
                f"GPU {index}: {gpu['name']}, compute capability {gpu['capability']}, {gpu['memory_gib']} GiB, "
                f"bf16 {'yes' if gpu['bf16'] else 'no'}, TF32 {'yes' if gpu['tf32'] else 'no'}",
            )
        )
    machine = machine_of(facts)
    hardware = problems(settings, machine)
    found += [Check("fail", problem.what, problem.fix) for problem in hardware]
    if not hardware:
        where = {"cuda": f"{len(facts['gpus'])} CUDA GPU(s)", "mps": "Apple MPS"}.get(
            target(settings, machine), f"CPU ({facts['cpus']} cores)"
        )
        found.append(Check("ok", f"accelerator {settings.accelerator}: {where}"))
        precision, why = fastest_precision(settings, machine)  # what fit trains in, as it says there
        chosen = f"precision {precision}" + (f" for the configured {settings.precision} ({why})" if why else "")
        found.append(Check("ok", f"{chosen}, strategy {settings.strategy}"))
    devices = settings.device_count or max(1, len(facts["gpus"]))
    found += data_checks(facts, data, devices)
{%- if cookiecutter.logger == "wandb" %}
    if any(is_wandb(logger) for logger in configured_loggers(trainer.get("logger"))):
        found.append(wandb_check())
{%- endif %}
    return found


def cuda_line(facts: dict) -> str:
    if not facts["cuda"]:
        return "torch is a CPU-only build"
    line = f"CUDA {facts['cuda']}, cuDNN {facts['cudnn']}"
    return line + (f", NCCL {facts['nccl']}" if facts["nccl"] else " (no CUDA device visible)")


def data_checks(facts: dict, data: dict, devices: int) -> list[Check]:
    cpus = facts["cpus"]
    workers = data["num_workers"]
    workers = auto_workers(cpus, devices) if workers == "auto" else int(workers)
    found = []
    if workers * devices > cpus:
        found.append(
            Check(
                "warn",
                f"{workers} workers x {devices} devices exceed the {cpus} CPUs",
                f"set data.num_workers to {auto_workers(cpus, devices)} or auto",
            )
        )
    else:
        found.append(Check("ok", f"{workers} data worker{'s' * (workers != 1)} per device, {cpus} CPUs"))

    shm = shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else None
    if shm is not None and workers > 0:
        # Workers hand batches over in shared memory: prefetched float batches of every device.
        side = int(data["image_size"])
        batch = int(data["batch_size"]) * 3 * side * side * 4
        needed = batch * workers * int(data["prefetch_factor"]) * devices
        if shm < 2 * needed:
            found.append(
                Check(
                    "warn",
                    f"/dev/shm is {shm / 2**30:.1f} GiB; the data workers may use {needed / 2**30:.1f} GiB",
                    "in Docker, run with --shm-size=16g or --ipc=host",
                )
            )
        else:
            found.append(Check("ok", f"/dev/shm {shm / 2**30:.1f} GiB"))
    return found


def data_folder_check(data: dict) -> Check:
    """The data as fit reads it before a run starts: the folder's layout, classes and splits."""
    try:
        module = ImageDataModule(**data)
        classes = module.class_names  # where fit stops on a missing or badly laid out folder
        if module.hparams.synthetic and not module.data_dir.exists():
            return Check("ok", f"data: the built-in shapes ({len(classes)} classes), drawn by fit in {module.data_dir}")
        module.check_folders()
    except UserError as error:
        return Check("fail", f"data: {error}")
    return Check("ok", module.describe_splits().replace("Data: ", "data: ", 1))


def weights_check(backbone: str) -> Check:
    """Whether fit will find the pretrained weights: in the cache, or within reach."""
    try:
        missing = pretrained_weights_missing(backbone)
    except UserError as error:  # a backbone name fit would refuse too
        return Check("fail", f"model: {error}")
    return Check("fail", missing) if missing else Check("ok", f"pretrained {backbone} weights: cached or within reach")
{%- if cookiecutter.logger == "wandb" %}


def wandb_check() -> Check:
    if importlib.util.find_spec("wandb") is None:  # fit would stop as the logger starts
        return Check("fail", "wandb, the W&B logger's package, is not installed", "pip install wandb")
    if problem := wandb_mode_problem():
        return Check("fail", problem.partition(": ")[0], problem.partition(": ")[2])
    if os.environ.get("WANDB_MODE"):
        return Check("info", f"W&B mode {os.environ['WANDB_MODE']} (from WANDB_MODE)")
    if has_api_key():
        return Check("ok", "W&B API key found")
    return Check("warn", "no W&B API key: runs will log offline", "wandb login, or set WANDB_API_KEY")
{%- endif %}


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", type=Path, default=[],
                        help="config files over the CLI's own, as fit takes them")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the machine and the checks as JSON")
    parser.add_argument("--smoke", action="store_true",
                        help="then train: a fast_dev_run and a two-batch fit whose checkpoint is reloaded")  # fmt: skip
    options = parser.parse_args(args)
    facts = machine_facts()
    config = resolved_config([f"--config={path}" for path in options.config])
    found = [*checks(facts, config), data_folder_check(config["data"])]
    if config["model"]["pretrained"] and not config["model"]["init_weights"]:  # with them, none are downloaded
        found.append(weights_check(config["model"]["backbone"]))
    if options.json:
        print(json.dumps({"machine": facts, "checks": [asdict(check) for check in found]}))
    else:
        for check in found:
            print(f"{check.verdict:>5}  {check.what}" + (f"  -> fix: {check.fix}" if check.fix else ""))
    if options.smoke:
        return smoke_test(facts, config["trainer"], options.config)
    return 1 if any(check.verdict == "fail" for check in found) else 0
