import ast
import contextlib
import datetime
import importlib.util
import itertools
import json
import os
import signal
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

# tomllib for the tests, on every Python the template supports.
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # noqa: F401 (imported by the tests from here)

TEMPLATE = Path(__file__).resolve().parents[1]

# Answers that need no environment and start no smoke test: the tests do those steps themselves.
QUIET = {"setup_env": "none", "smoke_test": "no"}

# Each answer's default: the first choice of a menu.
TEMPLATE_DEFAULTS = {
    key: value[0] if isinstance(value, list) else value
    for key, value in json.loads((TEMPLATE / "cookiecutter.json").read_text()).items()
    if not key.startswith("_")
}


def hook_constant(name: str, hook: str = "pre_gen_project"):
    """A literal a hook assigns to `name` (the hooks are rendered scripts: read, not imported)."""
    tree = ast.parse((TEMPLATE / "hooks" / f"{hook}.py").read_text())
    assignments = [node for node in tree.body if isinstance(node, ast.Assign)]
    (value,) = [node.value for node in assignments if ast.unparse(node.targets[0]) == name]
    return ast.literal_eval(value)


PACKAGE_SOURCE = TEMPLATE / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}"


def module_path(name: str) -> str:
    """Where the module `name` sits in a project, as the hook finds it: names are unique across subpackages."""
    (path,) = PACKAGE_SOURCE.rglob(f"{name}.py")
    return "src/{package}/" + path.relative_to(PACKAGE_SOURCE).as_posix()


# What each capability adds to a project when its answer is yes: the hook's table.
CAPABILITY_FILES = {
    question: [module_path(name) for name in modules] + [f"tests/{name}.py" for name in tests] + others
    for (question, keeping_answer), (modules, tests, others) in hook_constant("FILES_OF", "post_gen_project").items()
    if keeping_answer == "yes"
}
# The answers of the full render, every capability on.
EVERY_CAPABILITY = dict.fromkeys(CAPABILITY_FILES, "yes")
# A capability that works through another: {capability: (the one it needs, why)}; refused without it.
CAPABILITY_NEEDS = hook_constant("NEEDS")
# The marks of a capability that must not be left when its answer is no: a command, an import, a docs
# page, a config, an extra.
CAPABILITY_MARKS = {
    "inference": r"\bclassify\b|\bexport(s|ed|ing)?\b(?! PYTHONPATH)|[Pp]redictor|onnx|ONNX|"
    r"inference\.md|load_trained\b|checkpoint_preprocessing|takes_onnx",
    "serving": r"`serve`|serving\.md|litserve|image_requests|python-multipart|\[serve\]|,serve\b|\bserve\.py|"
    r'"serve"|{package} serve\b|EXPOSE',
    "experiments": r"optuna|\[sweep\]|,sweep\b|`sweep|`cv`|`repeat`|\"(sweep|cv|repeat)\"|crossval|search_space|"
    r"experiment_runs|experiments\.md|sweep\.(yaml|sbatch)|sweeps/|^cv/|{package} (sweep|cv|repeat)\b|gpus-per-trial",
    "timm": r"timm|[Hh]ugging ?[Ff]ace|HF_HOME|pretrained_cfg|drop_path",
    "streaming": r"litdata|LitData|streaming|streamed\b|`shard\b|\"shard\"|{package} shard\b|moto|data\.format",
    "tuning": r"`(tune|benchmark)\b|\"(tune|benchmark)\"|{package} (tune|benchmark)\b|\.(tune|benchmark) import|"
    r"tuning\.md|lr_find|make benchmark|resume benchmark|weights_only. was not set",
}


# Slow tests of tools rather than of what a generated project promises (the benchmark scripts, the GPU
# validation's dry run, the Docker install step, ...) run one day in three: CI's 40 minutes on two
# cores cannot hold every slow test, and a broken tool is found within three days.
ROTATION_DAYS = 3


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run the slow tests (as .ci/run does)")
    parser.addoption(
        "--rotation",
        choices=["today", "all"],
        default="today",
        help="with --run-slow, the rotated slow tests to run: today's share (default) or all of them",
    )


def rotation_day(seconds: dict[str, float]) -> dict[str, int]:
    """The day of the rotation on which each rotated test runs, from each one's time: the longest first,
    each to the day with the least so far, so the days take about as long (one test of 4 minutes made
    a day of turns by name 2 minutes longer than the other)."""
    days, load = {}, [0.0] * ROTATION_DAYS
    for name in sorted(seconds, key=lambda name: (-seconds[name], name)):
        days[name] = load.index(min(load))
        load[days[name]] += seconds[name]
    return days


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--run-slow"):
        skip = pytest.mark.skip(reason="slow: run with --run-slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
        return
    if config.getoption("--rotation") == "all":
        return
    rotated = [item for item in items if "rotated" in item.keywords]
    assert all("slow" in item.keywords for item in rotated), "a rotated test is a slow one: mark it slow too"
    seconds = {item.nodeid: item.get_closest_marker("rotated").kwargs.get("seconds") for item in rotated}
    assert None not in seconds.values(), "a rotated test gives its time in CI: @pytest.mark.rotated(seconds=...)"
    days = rotation_day(seconds)
    today = datetime.date.today().toordinal() % ROTATION_DAYS
    skip = pytest.mark.skip(reason="rotated: runs on the other day of the rotation (--rotation=all runs it now)")
    for item in rotated:
        if days[item.nodeid] != today:
            item.add_marker(skip)


def load_hardware_rules():
    """The generated project's hardware rules, which the pre-generation hook loads the same way."""
    path = PACKAGE_SOURCE / "hardware" / "rules.py"
    spec = importlib.util.spec_from_file_location("hardware_rules", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


hardware_rules = load_hardware_rules()


def is_valid(answers: dict[str, str]) -> bool:
    """The combinations the template accepts; the pre-generation hook refuses the others."""
    return not hardware_rules.problems(hardware_rules.from_answers(answers))


def needs_met(answers: dict[str, str]) -> bool:
    """No capability on without the one it needs (the pre-generation hook refuses that)."""
    return all(
        answers[needed] == "yes" for capability, (needed, _) in CAPABILITY_NEEDS.items() if answers[capability] == "yes"
    )


def yes_no(letters: str) -> list[str]:
    return ["yes" if letter == "y" else "no" for letter in letters]


def answer_matrix() -> list[dict[str, str]]:
    """Every valid mix of the options that interact, cycling the options that don't."""
    interacting = itertools.product(
        ["auto", "gpu", "cpu", "mps"],
        ["auto", "ddp", "fsdp", "deepspeed"],
        ["bf16-mixed", "16-mixed", "32-true"],
        ["wandb", "tensorboard", "csv"],
    )
    combos = [
        dict(zip(["accelerator", "strategy", "precision", "logger"], values, strict=True)) for values in interacting
    ]
    combos = [combo for combo in combos if is_valid(combo)]
    independent = {
        "backbone": ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16"],
        "image_size": ["64", "224", "96"],
        "python_version": ["3.11", "3.10", "3.12", "3.13"],
        # Import names from 1 to 30 characters (the longest the pre-generation hook takes): the code's
        # lines stay within ruff's limit, and ruff format joins none of its split ones.
        "project_name": ["Image Classifier", "Défect Spotter 2", "x", "X-Ray_Triage.v2 of Chest Films"],
        "devices": ["1", "2", "auto", "8"],
        # Periods of 2, 7, 11, 13, 17 and 19, prime to each other, to the loggers' run of 3 and the backbones'
        # of 5, a needed capability's overridden where one that needs it is on: every valid combination of the
        # capabilities occurs, each on and off with every logger and backbone (test_render.py checks it).
        "serving": yes_no("yn"),
        "inference": yes_no("nnnnnyynynynyynyyyn"),
        "experiments": yes_no("nnynyyy"),
        "tuning": yes_no("nynnynyyyynynnnyn"),
        "timm": yes_no("nnyynnnyynn"),
        "streaming": yes_no("yynnynyynnyyn"),
    }
    for index, combo in enumerate(combos):
        for key, values in independent.items():
            combo[key] = values[index % len(values)]
        if combo["accelerator"] == "mps":
            combo["devices"] = "1"
        elif not is_valid(combo):  # DDP or FSDP2 on the CPU with devices auto: one process
            combo["devices"] = "2"
        for capability, (needed, _) in CAPABILITY_NEEDS.items():
            if combo[capability] == "yes":
                combo[needed] = "yes"
        if combo["backbone"] == "vit_b_16":
            combo["image_size"] = "224"  # the one side a ViT takes (the hook refuses another)
    return combos


def run_bounded(command: list, timeout: float, **options) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout), in a process group
    of its own that goes whole when the command ends, times out or is interrupted: nothing it started
    (training ranks, data workers, a test session's commands) outlives it."""
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(process)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # something outside the group still holds the pipes
            stdout, stderr = "", ""
        pytest.fail(f"{' '.join(map(str, command))} did not end within {timeout} s:\n{stdout[-3000:]}{stderr[-3000:]}")
    finally:
        _end_group(process)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _end_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        # An interrupt first: a pytest session inside then ends the process groups of its own commands.
        _signal_group(process, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def python_with_test_packages(folder: Path, with_pip: bool) -> Path:
    """A new venv's Python that also imports the test environment's packages: installing a project
    into it checks the project's packaging, not a fresh torch download."""
    venv.create(folder, with_pip=with_pip)
    python = folder / "bin" / "python"
    purelib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(purelib.decode().strip()) / "test_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def render(output_dir: Path, **answers: str) -> Path:
    return Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(output_dir), extra_context=QUIET | answers))


@pytest.fixture(scope="session")
def default_project(tmp_path_factory) -> Path:
    return render(tmp_path_factory.mktemp("default"))


@pytest.fixture(scope="session")
def full_project(tmp_path_factory) -> Path:
    """The default answers with every capability on: the render whose test suite covers all the code."""
    return render(tmp_path_factory.mktemp("full"), **EVERY_CAPABILITY)
