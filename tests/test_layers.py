"""The layer table in docs/architecture.md is the import rule, and every import in idled/ keeps it.

Theory of operation
-------------------
The table under "The layers" has one row per package of idled/ and a last column, "may import (of idled)",
that names in backticks the packages its modules may import (``nothing`` for none). The test parses that
column, then walks every module of idled/ with `ast` -- so an import inside a function or under
``if TYPE_CHECKING`` counts like one at the top -- resolves relative imports, and maps each imported name
to its top-level package (``idled.server.edge.link`` -> ``server``). An import of the module's own package
is free, and so is the root ``idled`` package (it holds only ``__version__``). Anything else must be in the
row's list. The table itself must name every package that exists and allow no cycle, or "lower layers never
import higher ones" would mean nothing. Local files only: well under a second.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "idled"
PAGE = ROOT / "docs" / "architecture.md"
COLUMN = "may import (of idled)"
SERVER = PACKAGE / "server"
SERVER_COLUMN = "may import (of idled.server)"

_CODE = re.compile(r"`([a-z_]+)/?`")


def allowed_imports(page: str, column: str = COLUMN) -> dict[str, set[str]]:
    """package -> the packages it may import, from the last column of the table headed ``column``."""
    rows: dict[str, set[str]] = {}
    lines = iter(page.splitlines())
    for line in lines:
        if line.startswith("|") and line.rstrip().rstrip("|").rstrip().endswith(column):
            break
    else:
        raise AssertionError(f"no table with a {column!r} column in {PAGE.name}")
    next(lines)  # the |---| line
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = _CODE.fullmatch(cells[0])
        assert name, f"a row whose first cell is not a package: {line}"
        rule = cells[-1]
        targets = set(_CODE.findall(rule.split("(")[0]))  # a parenthesis explains; it lists nothing
        assert targets or rule == "nothing", f"{name.group(1)}: {rule!r} names no package (list them, or: nothing)"
        rows[name.group(1)] = targets
    return rows


def imported_packages(module: str, source: str, within: str = "idled") -> Iterator[tuple[int, str]]:
    """(line, top-level package) for every import of ``within`` in a module's source (``module``: its dotted
    name, ``idled.server.app``; for a package's ``__init__``, the package's name plus ``.__init__``): for
    ``within="idled.server"``, the sub-package or module of the server it names."""
    depth = within.count(".") + 1
    parts = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1
                base = parts[: len(parts) - node.level]
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")
            if top[:depth] == within.split("."):
                yield node.lineno, top[depth] if len(top) > depth else within


def violations(rows: Mapping[str, set[str]], module: str, source: str) -> list[str]:
    """The imports of one module that its package's row does not allow."""
    own = module.split(".")[1]
    if own == "__init__":  # the root package: the version, importing nothing of idled
        own, rows = "idled", {**rows, "idled": set()}
    if own not in rows:
        return [f"{module}: package {own!r} has no row in the layer table"]
    return [
        f"{module}:{line} imports {target} ({own} may import only {', '.join(sorted(rows[own])) or 'nothing'})"
        for line, target in sorted(imported_packages(module, source))
        if target not in (own, "idled") and target not in rows[own]
    ]


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield ".".join(path.relative_to(ROOT).with_suffix("").parts), path


def test_every_import_in_idled_keeps_the_layer_table() -> None:
    rows = allowed_imports(PAGE.read_text(encoding="utf-8"))
    found = [v for name, path in modules() for v in violations(rows, name, path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_table_lists_every_package_and_only_those() -> None:
    rows = allowed_imports(PAGE.read_text(encoding="utf-8"))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert set(rows) == packages
    assert all(targets <= packages for targets in rows.values()), rows


def test_the_table_allows_no_cycle() -> None:
    assert_acyclic(allowed_imports(PAGE.read_text(encoding="utf-8")))


def assert_acyclic(rows: Mapping[str, set[str]]) -> None:
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"the table allows a cycle: {' -> '.join([*path, package])}"
        if package not in done:
            for target in rows.get(package, ()):
                visit(target, (*path, package))
            done.add(package)

    for package in rows:
        visit(package, ())


def server_violations(rows: Mapping[str, set[str]], module: str, source: str) -> list[str]:
    """The imports of one module of a sub-package of ``idled.server`` that its row does not allow: another
    sub-package not listed, or a module directly in ``idled.server`` (the process entry points, above all)."""
    own = module.split(".")[2]
    if own not in rows:
        return [f"{module}: sub-package {own!r} has no row in the server's table"]
    return [
        f"{module}:{line} imports idled.server.{target} ({own} may import only "
        f"{', '.join(sorted(rows[own])) or 'nothing'} of the server)"
        for line, target in sorted(imported_packages(module, source, "idled.server"))
        if target != own and target not in rows[own]
    ]


def server_packages() -> set[str]:
    return {p.name for p in SERVER.iterdir() if (p / "__init__.py").is_file()}


def test_every_import_in_the_server_keeps_its_table() -> None:
    """Inside idled/server/, the sub-packages are layered too (the entry points -- app, standby, node --
    sit on top and import any of them; no sub-package imports an entry point)."""
    rows = allowed_imports(PAGE.read_text(encoding="utf-8"), SERVER_COLUMN)
    found = [v for name, path in modules() if name.count(".") >= 3 and name.split(".")[1] == "server"
             for v in server_violations(rows, name, path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_server_table_lists_every_sub_package_and_allows_no_cycle() -> None:
    rows = allowed_imports(PAGE.read_text(encoding="utf-8"), SERVER_COLUMN)
    assert set(rows) == server_packages()
    assert all(targets <= set(rows) for targets in rows.values()), rows
    assert_acyclic(rows)


# -- the checker itself --------------------------------------------------------------------------------------


def test_the_checker_catches_imports_inside_functions_and_relative_ones() -> None:
    rows = {"core": set(), "log": {"core"}, "server": {"core", "log"}}
    source = (
        "from idled import __version__\n"
        "from idled.core.wheel import Wheel\n"
        "def later():\n"
        "    from idled.server.app import Server\n"
        "    import idled.cli.main\n"
        "from ..server import bus\n"
        "from . import records\n"
    )
    found = violations(rows, "idled.log.eventlog", source)
    assert [v.split(" imports ")[1].split(" ")[0] for v in found] == ["server", "cli", "server"], found
    assert violations(rows, "idled.nope.x", "") == ["idled.nope.x: package 'nope' has no row in the layer table"]


def test_the_parser_reads_the_last_column() -> None:
    page = (
        "| package | job | may import (of idled) |\n|---|---|---|\n"
        "| `core/` | pure | nothing |\n| `ops/` | config | `core`, `log` (for limits and policy names) |\n"
        "| `cli/` | argv | `core`, `ops` |\n\nafter the table\n"
    )
    assert allowed_imports(page) == {"core": set(), "ops": {"core", "log"}, "cli": {"core", "ops"}}


def test_the_server_checker_catches_a_sub_package_reaching_up() -> None:
    rows = {"runtime": set(), "engine": {"runtime"}, "roles": {"runtime", "engine"}}
    source = (
        "from idled.server.runtime.clock import Clock\n"
        "from idled.server.engine.bus import EventBus\n"
        "def later():\n"
        "    from idled.server.roles.users import run_user\n"
        "    from idled.server.app import Server\n"
        "from idled.ops.config import Config\n"
    )
    found = server_violations(rows, "idled.server.engine.sessions", source)
    assert [v.split(" imports ")[1].split(" ")[0] for v in found] == ["idled.server.roles", "idled.server.app"]
    assert server_violations(rows, "idled.server.nope.x", "") == [
        "idled.server.nope.x: sub-package 'nope' has no row in the server's table"]
