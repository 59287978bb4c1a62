"""The GPU validation is ready before a GPU is lent: its wheels resolve and fit the device tool's
limit, it installs only what a machine lacks, and its dry run goes through every part on the CPU."""

import importlib.metadata
import json
import re
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import TEMPLATE, run_bounded

sys.path.insert(0, str(TEMPLATE / "benchmarks"))
import gpu_validation  # noqa: E402
import gpu_wheels  # noqa: E402


def make_wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    """A wheel holding only its METADATA, which is all gpu_wheels reads."""
    wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    metadata = "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n{metadata}")
    return wheel


def test_requirements_are_those_of_the_gpu_machine_and_the_extras_asked_for(tmp_path):
    wheel = make_wheel(tmp_path, "tool", "1.0", "always", "old; python_version < '3.9'",
                       "windows; sys_platform == 'win32'", "newer; python_version >= '3.12'",
                       "typed; extra == 'signatures'", "other; extra == 'other'")  # fmt: skip
    names = lambda requirements: [r.name for r in requirements]  # noqa: E731
    assert names(gpu_wheels.requirements(wheel)) == ["always", "newer"]
    assert names(gpu_wheels.requirements(wheel, {"signatures"})) == ["always", "newer", "typed"]


def test_only_missing_packages_and_those_too_old_for_the_others_are_installed(tmp_path):
    pytest_version = importlib.metadata.version("pytest")
    major = int(pytest_version.split(".")[0])
    make_wheel(tmp_path, "no-such-package-here", "1.0", f"pytest>={major + 1}")  # this pytest is too old for it
    make_wheel(tmp_path, "pytest", f"{major + 1}.0")
    make_wheel(tmp_path, "pyyaml", "1.0")  # present and not bounded: the machine's own stays
    chosen = [path.name for path in gpu_wheels.to_install(tmp_path)]
    assert chosen == ["no_such_package_here-1.0-py3-none-any.whl", f"pytest-{major + 1}.0-py3-none-any.whl"]

    (tmp_path / f"pytest-{major + 1}.0-py3-none-any.whl").unlink()
    make_wheel(tmp_path, "no-such-package-here", "1.0", f"pytest>={major}")
    assert [path.name for path in gpu_wheels.to_install(tmp_path)] == ["no_such_package_here-1.0-py3-none-any.whl"]


def test_a_part_reports_the_versions_of_the_carried_wheels_it_installed(tmp_path, monkeypatch):
    def install(folder: Path, site: Path) -> list[str]:
        (site / "deepspeed-99.0.dist-info").mkdir()
        (site / "deepspeed-99.0.dist-info" / "METADATA").write_text("Name: deepspeed\nVersion: 99.0\n")
        return ["deepspeed-99.0"]

    monkeypatch.setattr(gpu_wheels, "install", install)
    make_wheel(tmp_path, "deepspeed", "99.0")
    settings = gpu_validation.Settings.for_run(dry=True)
    validation = gpu_validation.Validation(settings, tmp_path / "work", tmp_path / "out", tmp_path)
    validation.start(2)
    assert validation.facts["deepspeed"] == "99.0"


def test_a_fetched_set_with_an_unmet_requirement_or_over_the_budget_is_refused(tmp_path, monkeypatch):
    make_wheel(tmp_path, "tool", "1.0", "helper>=2", "torch", "stranger")
    make_wheel(tmp_path, "helper", "1.5")
    found = gpu_wheels.problems(tmp_path, {})
    assert found == [
        "tool-1.0-py3-none-any.whl needs helper>=2, but helper-1.5-py3-none-any.whl was fetched",
        "tool-1.0-py3-none-any.whl needs stranger, which is neither fetched nor on the GPU machine",
    ]
    monkeypatch.setattr(gpu_wheels, "BUDGET_MIB", 0)
    assert "over the 0 MiB" in gpu_wheels.problems(tmp_path, {})[-1]


def test_a_differing_top_class_counts_only_beyond_a_tie():
    cpu = {"a.png": ("cat", 0.70, 0.20), "b.png": ("cat", 0.496, 0.494), "c.png": ("dog", 0.60, 0.30)}
    gpu = {"a.png": ("cat", 0.7005, 0.20), "b.png": ("dog", 0.4955, 0.4945), "c.png": ("cat", 0.51, 0.49)}
    figures = gpu_validation.compare_predictions(gpu, cpu)
    # b.png: the CPU's two best within 0.01, a tie; c.png: 0.3 apart, a real disagreement.
    assert figures["images"] == 3 and figures["other top-1 beyond a tie"] == 1
    assert figures["same top-1"] == pytest.approx(1 / 3) and figures["max diff of top-1 p"] == pytest.approx(5e-4)


def part(number: int, *checks: dict) -> dict:
    machine = {"GPU": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}
    return {"part": number, "dry_run": False, "machine": machine, "checks": list(checks)}


def check(name: str, status: str = "passed", **figures) -> dict:
    return {"part": 0, "name": name, "status": status, "seconds": 12.3, "figures": figures, "note": "",
            "command": "", "output": ""}  # fmt: skip


def test_the_report_tabulates_each_part_and_sets_resnet50_against_the_published_figures():
    text = gpu_validation.report([
        part(4, check("benchmark train resnet50, 224 px, batch 256", **{"images/s": 1950, "MFU %": 31.5}),
             check("resnet50 alone, synthetic batches on the device", **{"images/s": 2600.0}),
             check("benchmark data, JPEGs (224 px crops), workers 0,8,16", **{"0 workers": 310, "8 workers": 1700,
                                                                              "16 workers": 1650})),
        part(3, check("preset fsdp1", **{"ms/step": 41.25, "peak GiB": 3.5, "last checkpoint": "folder"}),
             check("preset deepspeed_stage2", "failed")),
    ])  # fmt: skip
    assert text.index("## Part 3") < text.index("## Part 4"), "parts in order"
    assert "| GPU | NVIDIA H100 80GB HBM3 |" in text
    assert "| preset fsdp1 | passed | 12 |  | 41.25 |  | 3.5 |" in text
    assert "| preset deepspeed_stage2 | failed |" in text
    # 2600 / 2600 and 1950 / 2600 against timm's figure; 2600 / 2470 against NVIDIA's.
    assert "## resnet50 on NVIDIA H100 80GB HBM3 against published A100 figures" in text
    assert "| timm, A100, AMP + channels_last, synthetic | 2600 | 100% | 75% |" in text
    assert "| NVIDIA DeepLearningExamples, A100 80GB, AMP | 2470 | 105% | 79% |" in text
    assert "the loader gives at best 1700 images/s (8 workers), against 1950 images/s the project trains" in text
    assert "the data loader bounds training there" in text
    assert "Dry run" not in text
    tables = re.findall(r"(?:^\|.*\n)+", text, re.MULTILINE)
    assert len(tables) == 4
    for table in tables:  # every row as many cells as its header: no "|" inside a cell
        assert len({row.count("|") for row in table.splitlines()}) == 1, table


@pytest.mark.slow
@pytest.mark.rotated(seconds=230)
def test_the_dry_run_goes_through_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    script = TEMPLATE / "benchmarks" / "gpu_validation.py"
    command = [sys.executable, str(script), "--part", "all", "--dry-run", "--out", str(out),
               "--work", str(tmp_path / "work"), "--wheels", str(tmp_path / "no-wheels")]  # fmt: skip
    result = run_bounded(command, 1200, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    parts = {number: json.loads((out / f"part{number}.json").read_text()) for number in (1, 2, 3, 4)}
    statuses = {c["name"]: c["status"] for p in parts.values() for c in p["checks"]}
    assert set(statuses.values()) <= {"passed", "parsed only", "skipped"}, statuses
    assert [name for name, status in statuses.items() if status == "skipped"] == ["carried wheels"]
    assert {name for name, status in statuses.items() if status == "parsed only"} == {
        "gpu, 8 data workers", "preset ddp", "preset fsdp1", "preset deepspeed_stage2",
        "preset deepspeed_stage3_offload", "gpu, 16-mixed", "gpu, 32-true (TF32 on, as configured)",
        "gpu, compile_mode default", "gpu, channels_last off"}  # fmt: skip

    setup = {c["name"]: c for c in parts[1]["checks"]}
    hooked = setup["generate with accelerator=gpu, setup_env=current, smoke test forced"]
    assert hooked["output"].startswith("==== image-classifier: setup summary ====")
    assert "smoke test passed" in hooked["output"]
    # No GPU here: the smoke test said so and ran on the CPU.
    assert "FALLBACK: accelerator gpu, but no CUDA GPU is visible: the smoke test runs on the CPU (accelerator cpu" in (
        hooked["output"])  # fmt: skip
    classified = setup["classify: cpu against cpu"]["figures"]
    assert classified["same top-1"] == 1 and classified["other top-1 beyond a tie"] == 0
    compared = setup["checkpoint on cpu against its ONNX export and against the CPU"]["figures"]
    assert compared["top-1 agree onnx"] == 1 and compared["max diff onnx(cpu)-pytorch(cpu)"] < 1e-4
    (gpu_tests,) = [c["figures"] for c in parts[2]["checks"]]
    assert gpu_tests["skipped"] >= 10 and "passed" not in gpu_tests, "without CUDA every GPU test skips"

    trained = {c["name"]: c["figures"] for c in parts[3]["checks"] if c["status"] == "passed" and c["figures"]}
    assert set(trained) == {"preset gpu", "preset fsdp"}
    drawn = sorted(path.name for path in (tmp_path / "work" / "shapes" / "train" / "circle").iterdir())
    assert drawn == ["00000-1.png", "00000.png", "00001-1.png", "00001.png", "00002-1.png", "00002.png",
                     "00003-1.png", "00003.png"], "each drawn image and its linked copy"  # fmt: skip
    assert trained["preset fsdp"]["last checkpoint"] == "folder" and trained["preset gpu"]["last checkpoint"] == "file"
    assert all(figures["images/s"] > 0 and figures["steps"] == 3 for figures in trained.values())
    speed = {c["name"]: c["figures"] for c in parts[4]["checks"]}
    assert speed["benchmark train resnet18, 32 px, batch 8"]["images/s"] > 0
    assert speed["resnet18 alone, synthetic batches on the device"]["images/s"] > 0
    assert list(speed["benchmark data, JPEGs (32 px crops), workers 0,1"]) == ["0 workers", "1 workers"]
    parity = [c for c in parts[4]["checks"] if c["name"].startswith("parity.py")][0]
    assert parity["figures"]["lightning / plain"] > 0
    # Its repetition's row ends with the two loops' last losses, which match when both did the same steps.
    (row,) = [line.split() for line in parity["output"].splitlines() if re.match(r"\s*0\s+\d", line)]
    assert row[-1] == row[-2]

    report = (out / "gpu-validation.md").read_text()
    assert report.startswith("# GPU validation\n\n**Dry run on the CPU**")
    assert [int(n) for n in re.findall(r"^## Part (\d)", report, re.MULTILINE)] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.rotated(seconds=45)
def test_the_wheels_for_the_gpu_machine_resolve_and_fit_the_device_tools_limit(tmp_path):
    # From the package registry; DeepSpeed's wheel is built here from its source.
    result = run_bounded([sys.executable, str(TEMPLATE / "benchmarks" / "gpu_wheels.py"), "--dest", str(tmp_path)], 600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    fetched = {gpu_wheels.wheel_name(path)[0] for path in tmp_path.glob("*.whl")}
    assert {"jsonargparse", "docstring-parser", "typeshed-client", "cookiecutter", "wandb", "deepspeed",
            "pydantic", "hjson"} <= fetched  # fmt: skip
    assert not fetched & {"torch", "numpy", "lightning"}, "what the GPU machine has does not travel"
    assert re.search(r"MiB {2}in \d+ wheels", result.stdout)
