"""Refuse answers that would render a broken project, before anything is written.

Standard library only (and torchvision or timm for a backbone our list lacks, when they are there): this runs
under the interpreter that runs cookiecutter, which usually has no torch. Each problem is one line
that names it and the fix.
"""

from __future__ import annotations  # cookiecutter may run under a Python older than the project's

import difflib
import importlib.util
import json
import keyword
import os
import re
import sys
from pathlib import Path

# Every answer as cookiecutter holds it.
ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")

# Importing the project under one of these names would import the other package instead, or break it:
# what any render's modules import, directly or through their dependencies (a template test keeps the
# list whole on Linux; colorama is tqdm's on Windows), the tools its extras install, and the project's
# own test modules.
TAKEN_NAMES = {
    "absl", "annotated_doc", "annotated_types", "anyio", "boto3", "botocore", "certifi", "charset_normalizer",
    "click", "cloudpickle", "colorama", "colorlog", "conftest", "cryptography", "cuda", "cycler", "dateutil",
    "deepspeed", "docstring_parser", "fastapi", "filelock", "fontTools", "fsspec", "google", "hatchling",
    "helper_callbacks", "huggingface_hub", "idna", "jmespath", "joblib", "jsonargparse", "kiwisolver", "lightning",
    "lightning_fabric", "lightning_utilities", "litdata", "litserve", "matplotlib", "moto", "mpl_toolkits", "mpmath",
    "multipart", "narwhals", "numpy", "onnx", "onnxruntime", "onnxscript", "opentelemetry", "optuna",
    "optuna_integration", "packaging", "PIL", "platformdirs", "pre_commit", "psutil", "pydantic", "pydantic_core",
    "pyparsing", "pytest", "python_multipart", "pytorch_lightning", "regex", "requests", "rich", "ruff", "s3transfer",
    "scipy", "six", "sklearn", "sniffio", "starlette", "sympy", "tensorboard", "test", "tests", "threadpoolctl",
    "timm", "torch", "torchgen", "torchmetrics", "torchvision", "tqdm", "triton", "typeshed_client",
    "typing_extensions", "typing_inspection", "urllib3", "uvicorn", "wandb", "watchfiles", "xdist", "xxhash", "yaml",
    "zmq",
}  # fmt: skip
STDLIB = getattr(sys, "stdlib_module_names", frozenset({"json", "os", "sys", "re", "typing", "types", "io", "logging"}))

# torchvision's classification models (torchvision 0.29). A name missing here is looked up in the
# torchvision cookiecutter runs with, if it has one (a newer release may add models); a template test
# keeps this list equal to list_models(module=torchvision.models).
TORCHVISION_CLASSIFIERS = {
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "convnext_tiny", "densenet121",
    "densenet161", "densenet169", "densenet201", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2",
    "efficientnet_b3", "efficientnet_b4", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7",
    "efficientnet_v2_l", "efficientnet_v2_m", "efficientnet_v2_s", "googlenet", "inception_v3", "maxvit_t",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "mobilenet_v2", "mobilenet_v3_large",
    "mobilenet_v3_small", "regnet_x_16gf", "regnet_x_1_6gf", "regnet_x_32gf", "regnet_x_3_2gf",
    "regnet_x_400mf", "regnet_x_800mf", "regnet_x_8gf", "regnet_y_128gf", "regnet_y_16gf", "regnet_y_1_6gf",
    "regnet_y_32gf", "regnet_y_3_2gf", "regnet_y_400mf", "regnet_y_800mf", "regnet_y_8gf", "resnet101",
    "resnet152", "resnet18", "resnet34", "resnet50", "resnext101_32x8d", "resnext101_64x4d", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "squeezenet1_0",
    "squeezenet1_1", "swin_b", "swin_s", "swin_t", "swin_v2_b", "swin_v2_s", "swin_v2_t", "vgg11", "vgg11_bn",
    "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn", "vit_b_16", "vit_b_32", "vit_h_14",
    "vit_l_16", "vit_l_32", "wide_resnet101_2", "wide_resnet50_2",
}  # fmt: skip

# The image sides torchvision's models take as they are built (a template test checks each): one
# side for ViTs and MaxViT, a smallest one for the others listed; by name prefix.
ONE_SIDE = {"vit_": 224, "maxvit_": 224}
SMALLEST_SIDE = {"inception_v3": 75, "alexnet": 63, "convnext_": 32, "vgg": 32, "densenet": 29,
                 "squeezenet1_0": 21, "squeezenet1_1": 17}  # fmt: skip

# The Pythons torch and lightning publish wheels for, and so the project's oldest Python may be. A text
# answer rather than a menu: cookiecutter refuses a value outside a menu with a traceback of its own.
PYTHON_VERSIONS = ("3.10", "3.11", "3.12", "3.13")

# A capability that works through another, and why: the template tests read this too.
NEEDS = {"serving": ("inference", "serve loads the model through classify's Predictor")}

# cookiecutter.json's stand-in slug for a project_name that slugifies to nothing: an empty slug would
# make the output folder itself the project and fail with "directory already exists".
NO_SLUG = "-"
# The generated code keeps its lines within ruff's 120 characters with an import name up to this long.
LONGEST_PACKAGE = 30


def is_timm_model(name: str) -> bool:
    """A timm/<model>[.<tag>] name: looked up in timm when it is here, else only its form is checked
    (the project checks the name itself when it builds the model)."""
    model = name.removeprefix("timm/")
    try:
        import timm
    except Exception:
        print(f"note: no timm where cookiecutter runs, so only the form of {name} was checked; fit looks it up.")
        return re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)?", model) is not None
    return model in (timm.list_models(pretrained=True) if "." in model else timm.list_models())


def timm_fixed_side(name: str) -> int | None:
    """The image side a timm model is made for where timm flags it as fixed (a ViT's 224), if timm is here."""
    try:
        import timm

        config = timm.get_pretrained_cfg(name.removeprefix("timm/"))
    except Exception:
        return None
    return config.input_size[-1] if config is not None and config.fixed_input_size else None


def is_torchvision_classifier(name: str) -> bool:
    if name in TORCHVISION_CLASSIFIERS:
        return True
    try:  # only for names the list lacks: importing torchvision takes seconds
        import torchvision.models

        return name in torchvision.models.list_models(module=torchvision.models)
    except Exception:  # absent, broken or too old to list its models: the list is the answer
        return False


# The project's own hardware rules (which accelerator, strategy, precision and devices go together),
# in the template's project folder, whose name is a template variable.
HARDWARE_RULES = "{*}/src/{*}/hardware/rules.py"


def hardware_rules_file() -> Path | None:
    """The rules in the template's folder: cookiecutter's _repo_dir (relative to where it started,
    if relative), or where cookiecutter and cruft run hooks from, their own working directory,
    which Linux shows to another process."""
    repo = ANSWERS.get("_repo_dir") or ANSWERS.get("_template", "")
    for folder in (Path(repo), Path(os.environ.get("PWD", "")) / repo, Path(f"/proc/{os.getppid()}/cwd")):
        found = next(folder.glob(HARDWARE_RULES), None) if folder.is_dir() else None
        if found:
            return found
    return None


def hardware_problems(answers: dict[str, str]) -> list[str]:
    path = hardware_rules_file()
    if path is None:
        print("note: the template's hardware rules were not found; the project checks them when it trains.")
        return []
    spec = importlib.util.spec_from_file_location("hardware_rules", path)
    rules = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = rules  # dataclasses look their module up while they are made
    spec.loader.exec_module(rules)
    return [f"{problem.what}: {problem.answers_fix}." for problem in rules.problems(rules.from_answers(answers))]


def side_problems(backbone: str, size: int) -> list[str]:
    """The image size a torchvision backbone cannot take (the project checks any model as it builds it)."""
    one = next((side for prefix, side in ONE_SIDE.items() if backbone.startswith(prefix)), None)
    if one is not None and size != one:
        return [f"{backbone} takes {one}-pixel images only, and image_size is {size}: answer image_size={one}."]
    least = next((side for prefix, side in SMALLEST_SIDE.items() if backbone.startswith(prefix)), 0)
    if size < least:
        return [f"{backbone} takes images of {least} pixels or more, and image_size is {size}: answer "
                f"image_size={least} or more, or another backbone such as resnet18."]  # fmt: skip
    return []


def problems(answers: dict[str, str]) -> list[str]:
    found = []
    slug, package = answers["project_slug"], answers["package_name"]
    if slug == NO_SLUG:
        found.append(
            f"project_name {answers['project_name']!r} has no letters or digits to make a folder name from: "
            "use a name with some (e.g. project_name='Leaf Disease'), or give project_slug and package_name."
        )
    elif not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", slug):
        found.append(
            f"project_slug {slug!r} is not a valid folder and distribution name: use letters, digits, '-', '_' "
            "and '.', starting with a letter (e.g. project_slug=my-classifier)."
        )
    if keyword.iskeyword(package):
        found.append(
            f"package_name {package!r} is a Python keyword: pick another (e.g. package_name={package}_classifier)."
        )
    elif not package.isidentifier() or package != package.lower():
        found.append(
            f"package_name {package!r} is not a valid lower-case Python identifier: use lower-case letters, "
            "digits and '_', starting with a letter (e.g. package_name=my_classifier)."
        )
    elif package in TAKEN_NAMES or package in STDLIB:
        found.append(
            f"package_name {package!r} shadows the module of that name "
            f"{'in the standard library' if package in STDLIB else 'that the project, its tools or tests use'}: "
            f"pick another (e.g. package_name={package}_classifier)."
        )
    elif len(package) > LONGEST_PACKAGE:
        words = package.split("_")
        heads = ("_".join(words[:count]) for count in range(len(words) - 1, 0, -1))
        usable = (head for head in heads if head not in TAKEN_NAMES | STDLIB and not keyword.iskeyword(head))
        shorter = next((head for head in usable if len(head) <= LONGEST_PACKAGE), package[:LONGEST_PACKAGE])
        found.append(
            f"package_name {package!r} is {len(package)} characters long, and the generated code's lines fit "
            f"ruff's limit with at most {LONGEST_PACKAGE}: give a shorter one, the project's folder may keep its "
            f"name (e.g. package_name={shorter})."
        )
    if answers["python_version"] not in PYTHON_VERSIONS:
        found.append(
            f"python_version {answers['python_version']!r} is not one the project's dependencies (torch, lightning) "
            f"support: use one of {', '.join(PYTHON_VERSIONS)} (e.g. python_version=3.11)."
        )
    for capability, (needed, why) in NEEDS.items():
        if answers[capability] == "yes" and answers[needed] != "yes":
            found.append(f"{capability} is yes and {needed} is no, but {why}: answer {needed}=yes, or {capability}=no.")
    backbone = answers["backbone"]
    if backbone.startswith("timm/"):
        if answers["timm"] != "yes":
            found.append(f"backbone {backbone!r} is a timm model, and timm is no: answer timm=yes, or pick a "
                         "torchvision model such as resnet18.")  # fmt: skip
        elif not is_timm_model(backbone):
            found.append(f"backbone {backbone!r} is not a timm model: see timm.list_models(pretrained=True).")
    elif not is_torchvision_classifier(backbone):
        close = difflib.get_close_matches(backbone.lower(), sorted(TORCHVISION_CLASSIFIERS), n=3, cutoff=0.5)
        fix = f"did you mean {' or '.join(close)}?" if close else "use one such as resnet18 or efficientnet_b0."
        found.append(f"backbone {backbone!r} is not a torchvision classification model (nor timm/<model>): {fix}")
    size = answers["image_size"]
    whole = r"[1-9][0-9]*"  # as Python and YAML read it: ASCII digits, no leading 0
    if not re.fullmatch(whole, size) or not 16 <= int(size) <= 4096:
        found.append(f"image_size {size!r} is not a side in pixels between 16 and 4096 (e.g. image_size=224).")
    else:
        found += side_problems(backbone, int(size))
        if backbone.startswith("timm/") and (side := timm_fixed_side(backbone)) not in (None, int(size)):
            # timm's flag is looser than fit's check (a forward pass): some such models take other sizes too.
            print(f"note: {backbone} was made for {side}-pixel images, and image_size is {size}: fit checks that it "
                  f"takes them, and if not, says so (then use image_size {side}).")  # fmt: skip
    devices = answers["devices"]
    if devices != "auto" and not re.fullmatch(whole, devices):
        found.append(f"devices {devices!r} is neither a positive whole number nor auto (e.g. devices=1).")
    found += hardware_problems(answers)
    return found


if __name__ == "__main__":
    found = problems(ANSWERS)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if found:
        # A failing hook is the only way cookiecutter offers to stop, and it follows with a traceback of its own.
        print(
            "Nothing was written. Run cookiecutter (or cruft) again with the fixed answers "
            "(the traceback it prints next is its report of this refusal, not another problem).",
            file=sys.stderr,
        )
        sys.exit(1)
