"""Render the template under every valid mix of answers and check what comes out."""

import ast
import itertools
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from conftest import (
    CAPABILITY_FILES,
    CAPABILITY_MARKS,
    EVERY_CAPABILITY,
    TEMPLATE,
    TEMPLATE_DEFAULTS,
    answer_matrix,
    hardware_rules,
    needs_met,
    render,
    run_bounded,
    tomllib,
)

MATRIX = answer_matrix()


PRESETS = ["auto", "cpu", "gpu", "ddp", "fsdp", "fsdp1", "deepspeed_stage2", "deepspeed_stage3_offload", "multinode"]
MODULES = [
    "__init__",
    "__main__",
    "backbone",
    "cli",
    "data",
    "errors",
    "model",
    "transforms",
    *(f"commands/{name}" for name in ["__init__", "consolidate", "curves", "doctor", "smoke_test"]),
    *(f"datasets/{name}" for name in ["__init__", "folders", "images", "sampling", "shapes"]),
    *(f"hardware/{name}" for name in ["__init__", "checks", "network", "rules", "sharding"]),
    *(f"training/{name}" for name in ["__init__", "batch_mixing", "callbacks", "checkpoint_io", "csv_logging", "ema"]),
    *(f"training/{name}" for name in ["metrics", "progress", "quiet", "random_state", "reports", "resume"]),
    *(f"training/{name}" for name in ["predictions", "run_folders", "sigterm"]),
]
DOCS = ["setup", "training", "evaluation", "configuration", "distributed", "docker", "development"]
TESTS = [
    "conftest",
    "helper_callbacks",
    "test_cli",
    "test_data",
    "test_distributed",
    "test_docs",
    "test_doctor",
    "test_errors",
    "test_exact_resume",
    "test_folds",
    "test_gpu",
    "test_hardware_rules",
    "test_make_env",
    "test_metrics",
    "test_model",
    "test_presets",
    "test_progress",
    "test_recipes",
    "test_report",
    "test_reproducibility",
    "test_resume",
    "test_safeguards",
    "test_shapes",
    "test_sharding",
    "test_smoke_test",
    "test_transforms",
    "test_warnings",
]


def expected_files(package: str, logger: str, accelerator: str, chosen: set[str]) -> set[str]:
    files = {
        ".cookiecutter.json",
        ".dockerignore",
        ".gitignore",
        ".pre-commit-config.yaml",
        ".github/workflows/tests.yml",
        "Dockerfile",
        "Makefile",
        "README.md",
        *(f"docs/{name}.md" for name in DOCS),
        "pyproject.toml",
        "configs/default.yaml",
        "scripts/torchrun.sh",
        "scripts/slurm.sbatch",
        "scripts/make_env.py",
        *(f"configs/trainer/{name}.yaml" for name in PRESETS),
        "configs/recipe/scratch.yaml",
        "configs/recipe/finetune.yaml",
        *(f"src/{package}/{name}.py" for name in MODULES),
        *(f"tests/{name}.py" for name in TESTS),
    }
    if logger == "wandb":
        files |= {f"src/{package}/training/wandb_logging.py", "tests/test_wandb_logging.py", "docs/wandb.md"}
    if accelerator == "mps":
        files.add("configs/trainer/mps.yaml")
    for capability in chosen:
        files |= {name.format(package=package) for name in CAPABILITY_FILES[capability]}
    return files


def chosen_capabilities(answers: dict[str, str]) -> set[str]:
    return {
        capability for capability in CAPABILITY_FILES if answers.get(capability, TEMPLATE_DEFAULTS[capability]) == "yes"
    }


def chosen_preset(answers: dict[str, str]) -> str:
    """The preset the answers choose; the default config reads it first."""
    strategy, accelerator = answers["strategy"], answers["accelerator"]
    if accelerator == "mps":  # one device, whatever the devices answer (auto or 1)
        return "mps"
    if strategy == "fsdp":
        return "fsdp"
    if strategy == "deepspeed":
        return "deepspeed_stage2"
    if strategy == "ddp" or answers["devices"] != "1":
        return "ddp"
    return accelerator


def references_to_absent_modules(project, package: str) -> set[str]:
    """Imports of the project's own modules and tests, and dotted names of its modules (class paths in
    configs, docs), that the render does not hold: what a capability left out may leave behind."""
    source, tests = project / "src" / package, project / "tests"
    dotted = {
        path: ".".join((package, *path.relative_to(source).with_suffix("").parts)) for path in source.rglob("*.py")
    }
    modules = {name.removesuffix(".__init__") for name in dotted.values()}
    # What a package's __init__ imports or assigns, which `from <package> import name` may name too.
    exported = {
        name.removesuffix(".__init__"): defined_names(path.read_text())
        for path, name in dotted.items()
        if path.name == "__init__.py"
    }

    def holds(chain: str) -> bool:  # pkg.training.callbacks.Class: packages, then a module, then what it holds
        parts = chain.split(".")
        for end in range(1, len(parts)):
            prefix, following = ".".join(parts[:end]), ".".join(parts[: end + 1])
            if prefix not in exported:
                return prefix in modules
            if following not in modules:
                return parts[end] in exported[prefix]
        return True

    absent = set()
    for path in [*dotted, *tests.glob("*.py")]:
        here = dotted.get(path, "").split(".")  # pkg.sub.module or pkg.sub.__init__: level 1 is pkg.sub
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):  # import <package>.x
                imported = {alias.name for alias in node.names if alias.name.startswith(f"{package}.")}
            elif not isinstance(node, ast.ImportFrom):
                continue
            elif node.level:  # from .x import y, from ..x import y, from . import x
                base = ".".join(here[: len(here) - node.level])
                module = f"{base}.{node.module}" if node.module else base
                imported = {f"{module}.{alias.name}" for alias in node.names}
            elif re.fullmatch(rf"{package}(\.\w+)*", node.module or ""):  # from <package>[.x] import y
                imported = {f"{node.module}.{alias.name}" for alias in node.names}
            elif re.fullmatch(r"conftest|test_\w+|helper_\w+", node.module or ""):
                imported = set() if (tests / f"{node.module}.py").is_file() else {node.module}
            else:
                continue
            absent |= {f"{path.name} imports {name}" for name in imported if not holds(name)}
    for name in rendered_files(project) - {".cookiecutter.json"}:
        # A dotted name that goes on past a module (pkg.data.ImageDataModule, pkg.cli:main).
        for chain in re.findall(rf"(?<![\w./-]){package}(?:\.\w+)+(?=[.:][A-Za-z_])", (project / name).read_text()):
            if not holds(chain):
                absent.add(f"{name} names {chain}")
    return absent


def defined_names(code: str) -> set[str]:
    nodes = ast.parse(code).body
    imported = {
        alias.asname or alias.name for node in nodes if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    return imported | {target.id for node in nodes if isinstance(node, ast.Assign) for target in node.targets}


def rendered_files(project) -> set[str]:
    skip = {"__pycache__", ".git"}
    return {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file() and not skip & set(p.parts)}


def test_matrix_covers_every_valid_mix():
    assert len(MATRIX) == len({tuple(sorted(c.items())) for c in MATRIX}) > 60
    for option, values in {
        "accelerator": {"auto", "gpu", "cpu", "mps"},
        "strategy": {"auto", "ddp", "fsdp", "deepspeed"},
        "precision": {"bf16-mixed", "16-mixed", "32-true"},
        "logger": {"wandb", "tensorboard", "csv"},
    }.items():
        assert {combo[option] for combo in MATRIX} == values
    capabilities = list(CAPABILITY_FILES)
    every_mix = {
        mix
        for mix in itertools.product(["yes", "no"], repeat=len(capabilities))
        if needs_met(dict(zip(capabilities, mix, strict=True)))
    }
    assert {tuple(combo[name] for name in capabilities) for combo in MATRIX} == every_mix


@pytest.mark.parametrize(
    "answers", MATRIX, ids=lambda a: "-".join(a[k] for k in ("accelerator", "strategy", "precision", "logger"))
)
def test_render(tmp_path, answers):
    project = render(tmp_path, **answers)
    package = project.name.replace("-", "_")
    assert project.name == re.sub(r"[^a-z0-9]+", "-", answers["project_name"].lower().replace("é", "e")).strip("-")
    chosen = chosen_capabilities(answers)
    assert rendered_files(project) == expected_files(package, answers["logger"], answers["accelerator"], chosen)
    for capability in CAPABILITY_FILES.keys() - chosen:
        marks = re.compile(CAPABILITY_MARKS[capability].format(package=package), re.MULTILINE)
        for name in rendered_files(project) - {".cookiecutter.json"}:
            mark = marks.search((project / name).read_text())
            assert not mark, f"{capability} is off, yet {name} holds {mark.group()!r}"

    for name in rendered_files(project):
        text = (project / name).read_text()
        # ${{ ... }} is GitHub Actions' own expression syntax, which must survive rendering; the
        # answers file, .cookiecutter.json, is a name the README gives.
        unrendered = r"(?<!\$)\{\{|\{%|\{#|(?<!\.)cookiecutter(?!\.json)"
        assert not re.search(unrendered, text), f"unrendered template text in {name}"

    assert references_to_absent_modules(project, package) == set()

    for name in rendered_files(project):
        if name.endswith((".yaml", ".yml")):
            assert yaml.safe_load((project / name).read_text()), f"{name} is empty"
    config = yaml.safe_load((project / "configs/default.yaml").read_text())
    trainer = config["trainer"]
    preset = chosen_preset(answers)
    assert (
        f'Path("configs/trainer/{preset}.yaml"), Path("configs/default.yaml")'
        in (project / "src" / package / "cli.py").read_text()
    )
    hardware = yaml.safe_load((project / f"configs/trainer/{preset}.yaml").read_text())["trainer"]
    devices = answers["devices"]
    assert hardware["accelerator"] == answers["accelerator"]
    assert hardware["devices"] == (devices if devices == "auto" else int(devices))
    # The cpu preset holds the CPU's fastest precision, which the bf16-mixed answer promises CPUs.
    assert hardware["precision"] == ("32-true" if preset == "cpu" else answers["precision"])
    # The settings the generation check judged are those the chosen preset trains with.
    judged, rendered = hardware_rules.from_answers(answers), hardware_rules.from_trainer(hardware)
    assert rendered.strategy == judged.strategy
    assert (rendered.accelerator, rendered.device_count) == (judged.accelerator, judged.device_count)
    assert rendered.precision == judged.precision or preset == "cpu"
    for executable in ("scripts/torchrun.sh", "scripts/slurm.sbatch", "scripts/sweep.sbatch"):
        assert not (project / executable).exists() or os.access(project / executable, os.X_OK), executable
    logger_class = {"wandb": "WandbLogger", "tensorboard": "TensorBoardLogger", "csv": "CSVLogger"}
    assert trainer["logger"]["class_path"].endswith(logger_class[answers["logger"]])
    # The answers are the signatures' defaults, which the recipe does not repeat.
    assert f'backbone: str = "{answers["backbone"]}",' in (project / "src" / package / "model.py").read_text()
    assert f"image_size: int = {answers['image_size']}," in (project / "src" / package / "data.py").read_text()
    assert "model" not in config and "image_size" not in config["data"]

    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == f">={answers['python_version']}"
    assert pyproject["project"]["scripts"] == {package: f"{package}.cli:main"}
    dependencies = " ".join(pyproject["project"]["dependencies"])
    assert ("wandb" in dependencies) == (answers["logger"] == "wandb")
    assert ("tensorboard" in dependencies) == (answers["logger"] == "tensorboard")
    assert ("deepspeed" in dependencies) == (answers["strategy"] == "deepspeed")

    assert_lints(project)


def assert_lints(project) -> None:
    for check in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "--no-cache", str(project)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_long_folder_name_beside_a_short_import_name_lints(tmp_path):
    # The folder (and W&B project) name has no length limit, so no line of code may hold it.
    answers = {"project_name": "Hyperspectral Crop Disease Classifier for Field Trials", "package_name": "crops"}
    assert_lints(render(tmp_path, **answers, **EVERY_CAPABILITY))


def readme_configs(project) -> set[str]:
    """The config files the README and docs/ name."""
    text = "".join(path.read_text() for path in [project / "README.md", *sorted((project / "docs").glob("*.md"))])
    named = set(re.findall(r"configs/[\w/.-]+\.yaml", text))
    # tuned.yaml is written by `benchmark data`, `tune` and `sweep`; sweep.yaml is a search space, not a
    # fit config: both are tested in the project.
    return named - {"configs/tuned.yaml", "configs/sweep.yaml"}


# Each config as `fit --config <config> --print_config` in one process: a process per config spent
# most of its 7 s importing torch and Lightning again.
PRINT_CONFIGS = """
import contextlib, io, json, sys
import yaml
from {package}.cli import main

configs, sys.argv[1:] = sys.argv[1:], []
printed = {{}}
for config in configs:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(["fit", "--config", config, "--print_config"])
        except SystemExit as exit:  # --print_config ends with status 0
            if exit.code:
                sys.exit(f"{{config}}: {{exit.code}}")
    printed[config] = yaml.safe_load(out.getvalue())
json.dump(printed, sys.stdout)
"""


def print_configs(project, configs: list[str]) -> dict[str, dict]:
    """What `fit --config <config> --print_config` prints, for each config, in their order."""
    result = run_bounded(
        [sys.executable, "-c", PRINT_CONFIGS.format(package=project.name.replace("-", "_")), *configs],
        300,
        cwd=project,
        env={"PYTHONPATH": str(project / "src"), "PATH": "/usr/bin:/bin", "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = json.loads(result.stdout)
    assert list(printed) == configs
    return printed


def test_every_config_the_readme_names_loads(default_project):
    configs = sorted(readme_configs(default_project))
    assert "configs/default.yaml" in configs
    for config in configs:
        assert (default_project / config).is_file(), f"README names {config}, which does not exist"
    for config, merged in print_configs(default_project, configs).items():
        assert merged["model"]["backbone"] == "resnet18" and merged["data"]["synthetic"] is True, config


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["tensorboard", "csv"])
def test_configs_load_for_other_loggers(tmp_path, logger):
    project = render(tmp_path, logger=logger, backbone="mobilenet_v3_small")
    for config, merged in print_configs(project, sorted(readme_configs(project))).items():
        assert merged["model"]["backbone"] == "mobilenet_v3_small", config


def test_the_templates_own_code_is_lint_clean():
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--no-cache", "tests", "benchmarks"],
            cwd=TEMPLATE,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
