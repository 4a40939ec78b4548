"""The figures' pages hold together.

docs/performance.md carries the current figure of each claim; the dated reports in
benchmarks/reports/ carry every measurement; benchmarks/README.md indexes them. This checks that the
index lists every report newest first, that each report states its date, machine and commands, that
every table of the performance page comes with a date, a command and a report, that the page's
figures are quoted from the reports, and that links, scripts and configs named there exist.

Run: .venv/bin/python -m pytest tests/test_performance_docs.py -q
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "benchmarks" / "reports"
PERFORMANCE = REPO / "docs" / "performance.md"
INDEX = REPO / "benchmarks" / "README.md"
DATE = re.compile(r"\b2\d{3}-\d{2}-\d{2}\b")
COMMAND = re.compile(r"`(python benchmarks/|bert-kit |torchrun |make |CUDA_VISIBLE_DEVICES=)")  # quoted, on the page
COMMAND_LINE = re.compile(r"python benchmarks/\w+\.py|python -m bert_kit \w|bert-kit \w+ --|torchrun |make demo")


def report_files() -> list[Path]:
    return sorted(REPORTS.glob("*.md"))


def tables_with_preamble(text: str) -> list[tuple[str, str]]:
    """Each markdown table of `text` with the prose between it and the heading or table before it."""
    found, prose, table = [], [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            found.append(("\n".join(prose), "\n".join(table)))
            prose, table = [], []
        prose = [] if line.startswith("#") else prose + [line]
    return found


def test_report_names_are_dated_topics():
    names = [p.name for p in report_files()]
    assert len(names) >= 30
    bad = [n for n in names if not re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9]+(-[a-z0-9]+)*\.md", n)]
    assert not bad, bad


def test_the_index_lists_every_report_once_newest_first():
    listed = re.findall(r"\]\(reports/([^)]+\.md)\)", INDEX.read_text())
    assert sorted(listed) == [p.name for p in report_files()], "benchmarks/README.md and benchmarks/reports/ differ"
    dates = [name[:10] for name in listed]
    assert dates == sorted(dates, reverse=True), "the index is not newest first"


@pytest.mark.parametrize("report", report_files(), ids=lambda p: p.stem)
def test_each_report_states_its_date_machine_and_commands(report):
    text = report.read_text()
    header = text.split("\n\n")[1]
    date = re.search(r"^- Date: (\S+)", header, flags=re.M)
    assert date and date.group(1) == report.name[:10], f"{report.name}: its Date line is not its name's date"
    assert re.search(r"^- Machine: \S", header, flags=re.M), f"{report.name}: no Machine line"
    assert re.search(r"^- Commands\b.*`", header, flags=re.M), f"{report.name}: no Commands line"
    assert COMMAND_LINE.search(text), f"{report.name}: names no command line"


def test_every_table_of_the_performance_page_has_a_date_a_command_and_a_report():
    tables = tables_with_preamble(PERFORMANCE.read_text())
    assert len(tables) >= 12
    for prose, table in tables:
        where = table.splitlines()[0][:80]
        both = prose + "\n" + table
        assert DATE.search(both), f"no date for the table starting {where}"
        assert COMMAND.search(both), f"no command for the table starting {where}"
        assert "../benchmarks/reports/" in both or "(timed for the README; no report)" in both, \
            f"no report for the table starting {where}"


def test_the_performance_page_quotes_its_figures_from_the_reports():
    reports = "\n".join(p.read_text() for p in report_files())
    text = re.sub(r"\]\([^)]*\)", "]", PERFORMANCE.read_text())  # link targets hold no figures
    figures = {a + b for a, b in re.findall(r"(?<![\w./-])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+(?:e-\d+)?)([kMx%]?)", text)}
    assert len(figures) > 200
    assert not sorted(f for f in figures if f not in reports), "figures on the performance page that no report holds"


def page_files() -> list[Path]:
    return list(dict.fromkeys([PERFORMANCE, INDEX, *report_files(), *sorted((REPO / "docs").glob("*.md")),
                               REPO / "README.md"]))


def test_links_scripts_and_configs_named_on_the_pages_exist():
    missing = []
    for page in page_files():
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+://", target) and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)}: link {target}")
        for path in re.findall(r"\b((?:benchmarks|configs)/[\w/.-]+\.(?:py|yaml))", text):
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, missing


def test_the_index_describes_every_benchmark_script():
    described = set(re.findall(r"^\| `([\w]+\.py)` \|", INDEX.read_text(), flags=re.M))
    scripts = {p.name for p in (REPO / "benchmarks").glob("*.py")}
    assert described == scripts


def test_nothing_points_at_the_old_results_log():
    old = "benchmarks/" + "RESULTS" + ".md"  # split into benchmarks/reports/
    assert not (REPO / old).exists()
    hits = []
    for folder in ("bert_kit", "docs", "benchmarks", "configs", "examples", "scripts", "tests"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in {".md", ".py", ".yaml", ".json", ".jsonl", ".sh", ".txt"}:
                text = path.read_text(errors="replace")
                if "RESULTS" + ".md" in text:
                    hits.append(str(path.relative_to(REPO)))
    assert not hits, hits
