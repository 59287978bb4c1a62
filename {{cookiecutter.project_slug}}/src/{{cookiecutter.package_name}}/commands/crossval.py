"""`cv --folds K [--seeds 0,1,2]` and `repeat --seeds 0,1,2`: runs that differ only in the
validation fold or the seed, and the mean and standard deviation of each metric over them.

cv trains K runs, each validated on one of K folds of the training images stratified by class
(data.num_folds, data.fold) and trained on the others; with --seeds, K runs for each seed. repeat
trains one run per seed on the configured split. Each run is a `fit` in a folder of its own under
cv/<name>/, its metrics those of its best checkpoint (by the checkpoints' monitored metric), kept in
metrics.json there: the same command again trains only the runs that have none. --gpus-per-trial 1
shares the runs among one process per GPU. The table goes to cv/<name>/summary.md, the spread of
each metric to summary.png.
"""

import argparse
import json
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from ..cli import SEEDS, resolved_config
from ..errors import PACKAGE, CommandParser, ConfigError, changed_settings
from ..training.checkpoint_io import write_whole
from ..training.run_folders import last_checkpoints
from .experiment_runs import (
    fit_in_folder,
    folder_name,
    gpus_for_copies,
    run_per_gpu,
    run_settings,
    same_options,
    without_option,
    worker_part,
)

CV = Path("cv")
# Written whole once a run has trained: its presence is what marks the run done.
METRICS = "metrics.json"


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(seed) for seed in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are whole numbers separated by commas (0,1,2), got {text!r}") from None
    if outside := [seed for seed in seeds if seed not in SEEDS]:
        raise argparse.ArgumentTypeError(f"seeds are from 0 to {SEEDS[-1]}, got {outside[0]}")
    if len(set(seeds)) < len(seeds):
        raise argparse.ArgumentTypeError(f"{text} names a seed twice")
    return seeds


def planned_runs(folds: int | None, seeds: list[int] | None) -> dict[str, list[str]]:
    """The folder name and the options of each run."""
    fold_options = {f"fold{k}": [f"--data.num_folds={folds}", f"--data.fold={k}"] for k in range(folds or 0)}
    seed_options = {f"seed{s}": [f"--seed_everything={s}"] for s in seeds or []}
    if not seed_options:
        return fold_options
    if not fold_options:
        return seed_options
    return {
        f"{seed}-{fold}": [*by_fold, *by_seed]
        for seed, by_seed in seed_options.items()
        for fold, by_fold in fold_options.items()
    }


def check_same_options(folder: Path, cli_args: list[str], runs: dict[str, list[str]], settings: dict) -> None:
    """Runs kept from an earlier call count, and stopped ones go on, only with the options they were
    started with: the same fit options and `settings` (run_settings: what the config files set), and
    each run's own (its fold and seed: another --folds splits the images otherwise). A call that
    started no run (refused, or stopped before its first checkpoint) holds the folder for no one."""
    kept = folder / "options.json"
    earlier = json.loads(kept.read_text()) if kept.is_file() else {}
    if isinstance(earlier, list):  # written before each run's own options were kept
        earlier = {"options": earlier, "runs": {}}
    started = [name for name in runs if (folder / name / METRICS).is_file() or last_checkpoints(folder / name)]
    if earlier and started:
        if not same_options(cli_args, earlier["options"]):
            said = " ".join(earlier["options"]) or "no options"
            raise ConfigError(f"{folder} holds runs started with other options ({said}): pass --name for a new set")
        if changed := changed_settings(earlier.get("settings", {}), settings):  # a config file edited since
            raise ConfigError(
                f"{folder} holds runs started with other settings ({changed}): put the config files back as they "
                "were, or pass --name for a new set"
            )
        if changed := [name for name in started if earlier["runs"].get(name, runs[name]) != runs[name]]:
            name = changed[0]
            raise ConfigError(
                f"{folder / name} was started with {' '.join(earlier['runs'][name])}, and this call gives it "
                f"{' '.join(runs[name])}: pass --name for a new set"
            )
    folder.mkdir(parents=True, exist_ok=True)
    settings = earlier.get("settings", settings) if earlier and started else settings
    write_whole(kept, json.dumps({"options": cli_args, "settings": settings, "runs": earlier.get("runs", {}) | runs}))


def train_runs(runs: dict[str, list[str]], cli_args: list[str], folder: Path) -> None:
    index, copies = worker_part()
    for name, options in list(runs.items())[index::copies]:
        kept = folder / name / METRICS
        if kept.is_file():
            print(f"{name}: kept from an earlier call ({kept})", flush=True)
            continue
        print(f"{name}: {' '.join(options)}", flush=True)
        metrics = fit_in_folder([*cli_args, *options], folder / name)
        write_whole(kept, json.dumps(metrics, indent=1))


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single run)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(runs: list[str], folder: Path) -> int:
    results = {name: json.loads((folder / name / METRICS).read_text()) for name in runs
               if (folder / name / METRICS).is_file()}  # fmt: skip
    missing = [name for name in runs if name not in results]
    if missing:
        print(f"Not trained yet: {', '.join(missing)}; run the same command again to train them.")
        return 1
    names = sorted({metric for metrics in results.values() for metric in metrics})
    # Counts (the best checkpoint's epoch and step) as counts: 14, and 13.5 ± 0.71 across runs.
    counts = {name for name in names if all(float(m[name]).is_integer() for m in results.values() if name in m)}

    def shown(name: str, value: float) -> str:
        return f"{value:.4g}" if name in counts else f"{value:.4f}"

    lines = [f"| run | {' | '.join(names)} |", "|" + " --- |" * (len(names) + 1)]
    lines += [
        f"| {run} | " + " | ".join(shown(n, metrics.get(n, float("nan"))) for n in names) + " |"
        for run, metrics in results.items()
    ]
    stats = {name: spread([metrics[name] for metrics in results.values() if name in metrics]) for name in names}
    spreads = [f"{shown(name, mean)} ± {shown(name, std)}" for name, (mean, std) in stats.items()]
    lines.append(f"| mean ± std ({len(results)} run{'s' * (len(results) != 1)}) | " + " | ".join(spreads) + " |")
    table = "\n".join(lines)
    (folder / "summary.md").write_text(f"# {folder.name}\n\n{table}\n")
    draw_spread(results, names, stats, folder / "summary.png")
    print(table)
    print(f"Table and plot: {folder / 'summary.md'}, {folder / 'summary.png'}")
    return 0


def draw_spread(results: dict[str, dict], names: list[str], stats: dict, path: Path) -> None:
    """Each metric in a panel of its own: every run as a point, the mean and one standard deviation either side."""
    figure, panels = plt.subplots(1, len(names), figsize=(2.6 * len(names), 3.2), squeeze=False)
    for axes, name in zip(panels[0], names, strict=True):
        runs = [run for run, metrics in results.items() if name in metrics]
        axes.scatter(range(len(runs)), [results[run][name] for run in runs], color="tab:blue", zorder=2)
        mean, std = stats[name]
        axes.axhline(mean, color="black")
        axes.axhspan(mean - std, mean + std, color="grey", alpha=0.25)
        axes.set_xticks(range(len(runs)), labels=runs, rotation=45 if len(runs) > 4 else 0)
        axes.set(title=name, xlabel="run")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(
    command: str,
    args: list[str],
    folds: int | None,
    seeds: list[int] | None,
    name: str,
    gpus: int | None,
    cli_args: list[str],
) -> int:
    runs = planned_runs(folds, seeds)
    folder = CV / name
    copies_on = gpus_for_copies() if gpus else []
    if worker_part()[1] == 1:
        # With --seeds each run's seed is its own: the configs' seed_everything is none of them.
        settings = run_settings(resolved_config(cli_args), free=("seed_everything",) if seeds else ())
        check_same_options(folder, cli_args, runs, settings)
    if copies_on:
        status = run_per_gpu(command, without_option(args, "--gpus-per-trial"), copies_on)
        if status:
            return status
    else:
        train_runs(runs, cli_args, folder)
        if worker_part()[1] > 1:
            return 0  # the process that started the copies sums up once they are all done
    return summarise(list(runs), folder)


def parser_for(command: str, description: str, default_name: str) -> argparse.ArgumentParser:
    parser = CommandParser(prog=f"{PACKAGE} {command}", description=description)
    parser.add_argument("--name", type=folder_name, help=f"the folder under cv/ (default: {default_name})")
    parser.add_argument(
        "--gpus-per-trial", type=int, choices=[1], help="1: one process per visible GPU, sharing the runs"
    )
    return parser


def main(args: list[str]) -> int:
    parser = parser_for(
        "cv",
        "Cross-validation: K runs, each validated on one fold, and the mean ± std of each metric.",
        "folds<K>, or folds<K>-seeds with --seeds",
    )
    parser.add_argument("--folds", type=int, required=True, help="how many folds (runs per seed), 2 or more")
    parser.add_argument(
        "--seeds", type=seed_list, help="seeds to train each fold with, as 0,1,2 (default: the configured one)"
    )
    options, cli_args = parser.parse_known_args(args)
    parser.check_at_least(options, {"--folds": 2})
    # Not named by the count of seeds: more seeds with the same options add runs to those kept.
    name = options.name or f"folds{options.folds}" + ("-seeds" if options.seeds else "")
    return run("cv", args, options.folds, options.seeds, name, options.gpus_per_trial, cli_args)


def repeat(args: list[str]) -> int:
    parser = parser_for("repeat", "The same run with each seed, and the mean ± std of each metric.", "seeds")
    parser.add_argument("--seeds", type=seed_list, required=True, help="the seeds, as 0,1,2")
    options, cli_args = parser.parse_known_args(args)
    name = options.name or "seeds"
    return run("repeat", args, None, options.seeds, name, options.gpus_per_trial, cli_args)
