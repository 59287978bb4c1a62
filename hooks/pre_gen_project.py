"""Refuse answers that would render a broken project, before anything is written.

Standard library only: this runs under the interpreter that runs cookiecutter, which usually has
no torch. Each problem is one line that names it and the fix.
"""

from __future__ import annotations  # cookiecutter may run under a Python older than the project's

import keyword
import re
import sys

ANSWERS = {
    "python_version": {{ cookiecutter.python_version | tojson }},
    "project_slug": {{ cookiecutter.project_slug | tojson }},
    "package_name": {{ cookiecutter.package_name | tojson }},
    "backbone": {{ cookiecutter.backbone | tojson }},
    "image_size": {{ cookiecutter.image_size | tojson }},
    "accelerator": {{ cookiecutter.accelerator | tojson }},
    "devices": {{ cookiecutter.devices | tojson }},
    "strategy": {{ cookiecutter.strategy | tojson }},
    "precision": {{ cookiecutter.precision | tojson }},
}

# Importing the project under one of these names would import the other package instead, or break it.
TAKEN_NAMES = {
    "deepspeed", "jsonargparse", "lightning", "lightning_fabric", "numpy", "PIL", "pytest", "pytorch_lightning",
    "rich", "tensorboard", "test", "tests", "torch", "torchmetrics", "torchvision", "wandb", "yaml",
}  # fmt: skip
STDLIB = getattr(sys, "stdlib_module_names", frozenset({"json", "os", "sys", "re", "typing", "types", "io", "logging"}))


def problems(answers: dict[str, str]) -> list[str]:
    found = []
    slug, package = answers["project_slug"], answers["package_name"]
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", slug):
        found.append(
            f"project_slug {slug!r} is not a valid folder and distribution name: use letters, digits, '-', '_' "
            "and '.', starting with a letter (e.g. project_slug=my-classifier)."
        )
    if not package.isidentifier() or keyword.iskeyword(package) or package != package.lower():
        found.append(
            f"package_name {package!r} is not a valid lower-case Python identifier: use lower-case letters, "
            "digits and '_', starting with a letter (e.g. package_name=my_classifier)."
        )
    elif package in TAKEN_NAMES or package in STDLIB:
        found.append(
            f"package_name {package!r} shadows the {'standard library' if package in STDLIB else 'dependency'} "
            f"module of that name: pick another (e.g. package_name={package}_classifier)."
        )
    if not re.fullmatch(r"3\.\d+", answers["python_version"]):
        found.append(f"python_version {answers['python_version']!r} is not a Python 3 version such as 3.11.")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", answers["backbone"]):
        found.append(
            f"backbone {answers['backbone']!r} is not a torchvision model name: use one such as resnet18, "
            "efficientnet_b0 or convnext_tiny."
        )
    size = answers["image_size"]
    if not size.isdigit() or not 16 <= int(size) <= 4096:
        found.append(f"image_size {size!r} is not a side in pixels between 16 and 4096 (e.g. image_size=224).")
    devices, accelerator = answers["devices"], answers["accelerator"]
    if devices != "auto" and not (devices.isdigit() and int(devices) > 0):
        found.append(f"devices {devices!r} is neither a positive whole number nor auto (e.g. devices=1).")
    strategy, precision = answers["strategy"], answers["precision"]
    if strategy in ("fsdp", "deepspeed") and accelerator in ("cpu", "mps"):
        found.append(f"strategy {strategy} needs NVIDIA GPUs: choose accelerator=gpu, or strategy=auto or ddp.")
    if accelerator == "mps" and (strategy != "auto" or devices not in ("1", "auto")):
        found.append("Apple's mps backend trains on one device: choose devices=1 and strategy=auto.")
    if precision == "16-mixed" and strategy == "fsdp":
        found.append(
            "strategy fsdp (FSDP2) runs in bf16-mixed or 32-true, not 16-mixed: choose one of those, or strategy ddp."
        )
    if precision == "16-mixed" and accelerator == "cpu":
        found.append("precision 16-mixed (float16 AMP) does not run on CPU: choose bf16-mixed or 32-true.")
    return found


if __name__ == "__main__":
    found = problems(ANSWERS)
    for problem in found:
        print(f"ERROR: {problem}", file=sys.stderr)
    if found:
        print("Nothing was written. Run cookiecutter again with the fixed answers.", file=sys.stderr)
        sys.exit(1)
