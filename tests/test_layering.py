"""The packages form floors and imports only run down (issue 14): a module may import its own package or a
package on a lower floor, never one beside it or above it. Read from the code's own import statements."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOORS = {
    "infra": 1,
    "serving": 2,
    "evalsuite": 2,
    "distill": 2,
    "posttrain": 3,
    "gateway": 3,
    "release": 4,
    "bench": 4,
    "feedback": 4,
    "cli": 5,
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & set(FLOORS)


def test_imports_only_run_down_the_floors() -> None:
    upward = []
    for package, floor in FLOORS.items():
        for path in sorted((REPO / package).rglob("*.py")):
            for imported in _imports(path) - {package}:
                if FLOORS[imported] >= floor:
                    upward.append(
                        f"{path.relative_to(REPO)} (floor {floor}) imports {imported} (floor {FLOORS[imported]})"
                    )
    assert not upward, "\n".join(upward)
