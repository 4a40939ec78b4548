"""`bert-kit glue`: fine-tune and score a model on every GLUE task under the data root, and the GLUE score.

    bert-kit glue --model sentence-transformers/all-MiniLM-L6-v2
    bert-kit glue --model runs/cram --tasks cola,sst2,rte --gpus 0,1,2,3 --lrs 1e-4,5e-5 --seeds 1,2,3
    bert-kit glue --model M epochs=1 max_train_examples=2000        # settings for every run

The tasks, their files, metrics and recipes are `bert_kit.tasks.glue`; the runs (one process per
GPU, finished runs kept) `bert_kit.tasks.glue_runs`; docs/glue.md describes both. Writes
OUTPUT_DIR/glue_results.json and prints a markdown table with the GLUE score.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError
from bert_kit.cli.errors import describe
from bert_kit.cli.options import add_model_option
from bert_kit.data.root import DATA_ROOT_VARIABLE, data_root
from bert_kit.model_folder import locate_model
from bert_kit.outputs import FolderLock, OutputFolder, write_record, write_text
from bert_kit.tasks.glue import TASKS, build_report, find_tasks, markdown_table, recipe_table, task_name
from bert_kit.tasks.glue_runs import (changed_inputs, check_configs, check_overrides, earlier_result, finished,
                                      log_path, lr_name, plan_runs, run_all, visible_gpus)

WRITTEN_BY = "bert-kit glue"
RESULTS = "glue_results.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser, "a preset name trains from random weights (give tokenizer=FOLDER)")
    parser.add_argument("--tasks", default=None, metavar="LIST",
                        help=f"comma-separated tasks (default: every task whose files are there): {','.join(TASKS)}")
    parser.add_argument("--gpus", default=None, metavar="LIST",
                        help="GPUs to run on, one process each, e.g. 0,1,2,3 (indices among the visible GPUs; "
                             "0,0 runs two processes on GPU 0), or cpu (default: every visible GPU, else the CPU)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help=f"the GLUE folder, glue_data layout (default: ${DATA_ROOT_VARIABLE}/glue, else "
                             "./data/glue)")
    parser.add_argument("--output-dir", default="runs/glue", metavar="DIR",
                        help="where the runs and glue_results.json go; finished runs there are kept "
                             "(default runs/glue)")
    parser.add_argument("--lrs", default="auto", metavar="LIST",
                        help="learning rates to sweep, e.g. 1e-4,5e-5 (default auto: by the model's size)")
    parser.add_argument("--seeds", default="42", metavar="LIST", help="seeds to sweep, e.g. 1,2,3 (default 42)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="fine-tuning settings for every run, e.g. epochs=1 batch_size=16 precision=fp32 "
                             "(`bert-kit finetune --help` lists them)")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("recipes (docs/glue.md; batch 32, 10% warmup, weight decay 0.01; lr auto: 1e-4 up to 60M "
                     "parameters, 5e-5 up to 200M):\n" + recipe_table())


def parse_list(flag: str, text: str, parse: Any, what: str, unique: bool = True) -> list:
    """A comma-separated flag value; each item through `parse`, a bad one named with the flag;
    unique: an item given twice is kept once."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{flag} is empty: give {what}")
    out = []
    for item in items:
        try:
            value = parse(item)
        except ConfigError:  # a message of its own (an unknown task names the nearest)
            raise
        except (TypeError, ValueError):
            raise ConfigError(f"{flag} {text}: {item!r} is not {what}") from None
        if value not in out or not unique:
            out.append(value)
    return out


def learning_rate(text: str) -> float | str:
    if text == "auto":
        return text
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(text)
    return value


def seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**32:
        raise ValueError(text)
    return value


def choose_gpus(text: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries of the GPUs to run on ([]: the CPU)."""
    visible = visible_gpus()
    if text is None:
        return visible
    if text.strip().lower() == "cpu":
        return []
    indices = parse_list("--gpus", text, int, "a GPU index (0, 1, ...) or cpu", unique=False)  # 0,0: two processes
    for i in indices:
        if not 0 <= i < len(visible):
            seen = f"{len(visible)} visible GPU{'s' * (len(visible) != 1)}" if visible else "no visible GPU"
            raise ConfigError(f"--gpus {text}: there is {seen} (CUDA_VISIBLE_DEVICES, nvidia-smi): "
                              f"{'use indices 0..' + str(len(visible) - 1) if visible else 'use --gpus cpu'}")
    return [visible[i] for i in indices]


def glue_folder(data: str | None) -> Path:
    """--data, else the data root's glue/; a missing folder is one line saying how to give it."""
    if data is not None:
        root = Path(data).expanduser()
        if not root.is_dir():
            raise ConfigError(f"--data {data}: {'not a folder' if root.exists() else 'folder not found'} "
                              "(name the folder holding CoLA/, SST-2/, ...: docs/glue.md)")
        return root
    root = data_root() / "glue"
    if not root.is_dir():
        raise ConfigError(f"no GLUE folder at {root} ({DATA_ROOT_VARIABLE} is the data root): pass --data DIR, the "
                          "folder holding CoLA/, SST-2/, ... (docs/glue.md says where to get them)")
    return root


def run(args: argparse.Namespace) -> int:
    t0 = getattr(args, "started", None) or time.time()
    root = glue_folder(args.data)
    # --tasks "" is no task list (it ran every task); left out, every task whose files are there
    wanted = None if args.tasks is None else parse_list("--tasks", args.tasks, task_name,
                                                        f"one or more GLUE tasks ({','.join(TASKS)})")
    present, missing = find_tasks(root, wanted)
    locate_model(args.model)  # a model that is not there fails now, not in every run
    lrs = parse_list("--lrs", args.lrs, learning_rate, "a learning rate in (0, 1) or auto")
    seeds = parse_list("--seeds", args.seeds, seed, "a seed 0 <= seed < 2**32")
    overrides = check_overrides(args.overrides)
    gpus = choose_gpus(args.gpus)
    out = OutputFolder(args.output_dir, "--output-dir", WRITTEN_BY).path  # holds only what earlier glue runs wrote

    with FolderLock(out):  # one bert-kit glue at a time in a folder
        write_record(out, [RESULTS, *present], WRITTEN_BY, merge=True)
        runs = plan_runs(args.model, present, out, lrs, seeds, overrides, notes=note)
        kept = {r["id"]: g for r in runs if (g := finished(r)) is not None}
        todo = [r for r in runs if r["id"] not in kept]
        check_configs(todo, "cuda" if gpus else "cpu")
        where = f"GPU {','.join(gpus)}" if gpus else "the CPU"
        note(f"{len(present)} task(s) ({', '.join(TASKS[n].title for n in present)}) x {len(lrs)} lr x {len(seeds)} "
             f"seed(s): {len(runs)} run(s), {len(kept)} finished earlier and kept; {len(todo)} to run on {where}"
             + (f"; missing: {', '.join(TASKS[n].title for n in missing)}" if missing else ""))
        for run_id in kept:
            note(f"{run_id}: finished earlier, kept")
        for run in todo:  # finished with these settings, but on other data or another model
            earlier = earlier_result(run)
            if earlier is not None:
                changed = changed_inputs(run, earlier)
                shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
                note(f"{run['id']}: {shown} changed since it finished: running it again")

        outcomes: dict[str, dict] = {r: {"glue": g} for r, g in kept.items()}
        context = {"args": args, "root": root, "present": present, "missing": missing, "runs": runs,
                   "outcomes": outcomes, "out": out, "t0": t0, "gpus": gpus, "lrs": lrs, "seeds": seeds}

        def on_event(kind: str, run: dict, where: str, outcome: dict | None) -> None:
            if kind == "start":
                log = f" (output: {log_path(run)})" if len(gpus) > 1 else ""
                note(f"{run['id']}: fine-tuning on {where}{log}")
                return
            outcomes[run["id"]] = outcome
            note(f"{run['id']}: {outcome_line(run, outcome)}")
            write_report(context)  # after every run: a long sweep's figures so far are on disk

        try:
            outcomes.update(run_all(todo, gpus, on_event))
        except KeyboardInterrupt:
            write_report(context)
            note("interrupted: finished runs are kept; run the same command again to continue")
            return 130
        report = write_report(context)
    print(markdown_table(report))
    print(f"\nwrote {out / RESULTS}; wall time {time.time() - t0:.1f} s")
    return exit_code(runs, outcomes)


class WorkersEnded(OSError):
    """Every worker process ended with runs still waiting: the run failed here (exit 1), not the command."""


def note(line: str) -> None:
    print(f"glue: {line}", file=sys.stderr, flush=True)


def outcome_line(run: dict, outcome: dict) -> str:
    if "glue" in outcome:
        task, glue = TASKS[run["task"]], outcome["glue"]
        figures = "/".join(f"{glue['metrics'][k]:.1f}" for k in task.metric_keys)
        return f"{task.title} {task.shown} {figures} (lr {lr_name(glue['lr'])}, {glue['seconds']:.1f} s)"
    if "stopped" in outcome:
        return f"stopped by {outcome['stopped']} (a checkpoint was saved: run the command again to continue)"
    return f"failed: {describe(outcome['error'])[1]}"


def write_report(context: dict) -> dict:
    """glue_results.json from the runs finished so far (kept ones included)."""
    by_task: dict[str, list] = {name: [] for name in context["present"]}
    failed: dict[str, str] = {}
    for run in context["runs"]:
        outcome = context["outcomes"].get(run["id"]) or {}
        if "glue" in outcome:
            by_task[run["task"]].append(outcome["glue"])
        elif "error" in outcome:
            failed.setdefault(run["task"], f"{run['id']}: {describe(outcome['error'])[1]}")
    args = context["args"]
    report = build_report(args.model, str(context["root"]), by_task, context["missing"], failed,
                          lrs=context["lrs"], seeds=context["seeds"], settings=list(args.overrides),
                          gpus=context["gpus"] or "cpu", wall_time_s=round(time.time() - context["t0"], 2))
    write_text(context["out"] / RESULTS, json.dumps(report, indent=2) + "\n")
    return report


def exit_code(runs: list[dict], outcomes: dict[str, dict]) -> int:
    """0 when every run finished; else one error line per failed run (and the worst exit code),
    or 130/143 when a run was stopped by a signal (the runs it kept from starting are named as
    not run, on one line)."""
    code, seen = 0, set()
    stopped = next((o["stopped"] for o in outcomes.values() if "stopped" in o), None)
    if stopped is not None:
        waiting = [run["id"] for run in runs if run["id"] not in outcomes]
        if waiting:
            note(f"not run, the command was interrupted ({stopped}): {', '.join(waiting)}; run the same command "
                 "again to run them")
    for run in runs:
        outcome = outcomes.get(run["id"])
        if outcome is None and stopped is not None:
            continue  # said above
        if outcome is None:
            outcome = {"error": WorkersEnded("not run: every worker process had ended before this run started "
                                             "(their logs beside the run folders say why)")}
        if "stopped" in outcome:
            code = max(code, 130 if outcome["stopped"] == "SIGINT" else 143)
        elif "error" in outcome:
            run_code, message = describe(outcome["error"])
            if message not in seen:  # a setting every run refuses is said once
                print(f"bert-kit glue: error: {run['id']}: {message}", file=sys.stderr)
                seen.add(message)
            code = max(code, run_code)
    return code
