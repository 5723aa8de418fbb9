"""docs/failures.md's table of every code names, for each, a test that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "docs" / "failures.md"
TABLE_TITLE = "## Every code: where it is caught, for which jobs, and the test that proves it"


def _table() -> dict[str, str]:
    text = CATALOG.read_text()
    rows = text.split(TABLE_TITLE, 1)[1]
    return {m[1]: m[2] for m in re.finditer(r"^\| ([A-Z]\d{3}) \| [^|]+ \| [^|]+ \| (.+) \|$", rows, re.M)}


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


def test_every_catalog_code_has_a_row_and_every_named_test_exists() -> None:
    table = _table()
    codes = set(re.findall(r"^\| ([A-Z]\d{3}) \|", CATALOG.read_text().split(TABLE_TITLE, 1)[0], re.M))
    assert codes - set(table) == set(), "codes of the catalog missing from the table"
    assert set(table) - codes == set(), "codes of the table with no row in the catalog above it"
    missing = []
    for code, cell in table.items():
        current: Path | None = None
        for ref in re.findall(r"([\w/]*\.py)?::(\w+)", cell):
            file, name = ref
            current = REPO / "tests" / file if file else current
            if current is None or not current.is_file() or name not in _tests_in(current):
                missing.append(f"{code}: {file}::{name}")
        if code != "P007" and "::" not in cell:
            missing.append(f"{code}: no test named")
    assert missing == []


def _string_constants(root: Path) -> set[str]:
    found: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def test_every_catalog_code_is_one_the_code_can_give() -> None:
    # A code documented but given nowhere (N002 was, until 2026-11-27) is one a user filters for in vain.
    table = _table()
    given = set().union(
        *(_string_constants(REPO / part) for part in ("flightdeck", "service", "worker", "cli"))
    )
    # P007 is documented as not applicable: the recipe has no DeepSpeed or FSDP option.
    assert sorted(code for code in table if code not in given and code != "P007") == []
