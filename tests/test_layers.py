"""The layers import downward only: the model, `data/`, `training/`, the engines, `tasks/`, `cli/`.
A static check of every import statement (lazy ones inside functions included), as
/work/shared/hooks/import_cycles.py reads them; and docs/architecture.md's layer table holds: every
module is in it, and each imports only from its own row and the rows above.

Run: .venv/bin/python -m pytest tests/test_layers.py -q
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bert_kit"

# a layer's modules never import these (the layers above it)
ABOVE = {
    "training": ("bert_kit.jax", "bert_kit.tasks", "bert_kit.cli", "bert_kit.serving"),
    "jax": ("bert_kit.tasks", "bert_kit.cli", "bert_kit.serving"),
    "data": ("bert_kit.training", "bert_kit.jax", "bert_kit.tasks", "bert_kit.cli", "bert_kit.serving"),
}


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement of a module file, relative ones resolved."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_layer_imports_nothing_from_the_layers_above_it(layer):
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
             for path in sorted((PACKAGE / layer).rglob("*.py")) for line, module in imported(path)
             if module.startswith(ABOVE[layer])]
    assert not wrong, "imports up the layers:\n" + "\n".join(wrong)


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    module = tmp_path / "bert_kit" / "training" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f():\n    from bert_kit.jax.engine import JaxEngine\n    from ..tasks import make_task\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "bert_kit"
    try:
        assert [m for _, m in imported(module)] == ["bert_kit.jax.engine", "bert_kit.jax.engine.JaxEngine",
                                                    "bert_kit.tasks", "bert_kit.tasks.make_task"]
    finally:
        PACKAGE = saved


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def layer_rows() -> list[list[str]]:
    """The modules column of docs/architecture.md's layer table, top row first: names relative to
    bert_kit/, a module (`model.py`, `kernels/packing.py`) or a package (`data/`)."""
    section = ARCHITECTURE.read_text().split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ")][2:]  # below the header
    return [re.findall(r"`([\w/]+(?:\.py|/))`", cell) for cell in cells]


def row_of(module: str, rows: list[list[str]]) -> int | None:
    """The row of a module file (relative to bert_kit/): the row naming it, else its package's."""
    exact = [i for i, names in enumerate(rows) if module in names]
    if exact:
        return exact[0]
    packages = [(len(name), i) for i, names in enumerate(rows) for name in names
                if name.endswith("/") and module.startswith(name)]
    return max(packages)[1] if packages else None


def module_file(dotted: str) -> str | None:
    """The file (relative to bert_kit/) that an imported name comes from: its longest dotted prefix
    that is a module or a package; None for bert_kit itself and for names outside it."""
    parts = dotted.split(".")
    if parts[0] != "bert_kit":
        return None
    for end in range(len(parts), 1, -1):
        path = PACKAGE.joinpath(*parts[1:end])
        if path.with_suffix(".py").is_file():
            return "/".join(parts[1:end]) + ".py"
        if (path / "__init__.py").is_file():
            return "/".join(parts[1:end]) + "/__init__.py"
    return None


def package_modules() -> list[str]:
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_the_layer_table_names_every_module_once():
    rows = layer_rows()
    assert len(rows) >= 10 and all(rows), rows
    names = [name for row in rows for name in row]
    assert len(names) == len(set(names)), "a name in two rows"
    missing = [m for m in package_modules() if row_of(m, rows) is None]
    assert not missing, f"modules that docs/architecture.md's layer table does not place: {missing}"


def test_each_module_imports_only_from_its_row_and_the_rows_above():
    rows = layer_rows()
    wrong = []
    for module in package_modules():
        row = row_of(module, rows)
        for line, name in imported(PACKAGE / module):
            target = module_file(name)
            if target is not None and row_of(target, rows) > row:
                wrong.append(f"bert_kit/{module}:{line} imports bert_kit/{target} (row {row_of(target, rows) + 1} "
                             f"of the table, below row {row + 1})")
    assert not wrong, "imports up docs/architecture.md's layers:\n" + "\n".join(sorted(set(wrong)))


def test_the_table_check_sees_an_import_up_the_layers():
    rows = layer_rows()
    model, training = row_of("model.py", rows), row_of("training/loop.py", rows)
    assert model < training  # so `model.py` importing the loop would be refused
    assert row_of("kernels/packing.py", rows) == model and row_of("kernels/fast_path.py", rows) > model
    assert module_file("bert_kit.training.loop.TrainingLoop") == "training/loop.py"
    assert module_file("bert_kit.kernels") == "kernels/__init__.py" and module_file("torch.nn") is None
