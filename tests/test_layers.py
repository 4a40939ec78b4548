"""The layers import downward only: the model, `data/`, `training/`, the engines, `tasks/`, `cli/`.
A static check of every import statement (lazy ones inside functions included), as
/work/shared/hooks/import_cycles.py reads them.

Run: .venv/bin/python -m pytest tests/test_layers.py -q
"""

import ast
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
