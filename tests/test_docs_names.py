"""Every dotted name of idled that a docstring or a page gives resolves to real code.

Theory of operation
-------------------
Docstrings and pages point the reader at code by name: ``idled.server.roles.users.run_user``,
``idled.ops.health.Health``, or, inside the package, relatively (``users.user_frame`` from
``idled/server/roles/plane.py``). A name that moved or went away sends the reader nowhere, and nothing else
notices: the code still runs. So this test collects the names and resolves each one as Python would --
import the module, then ``getattr`` along the chain, importing a submodule where a package lacks the
attribute -- and fails listing every name that does not resolve, with its file and line.

Which text counts as a name:

* in README.md and docs/*.md, every fully dotted ``idled.x.y`` name (prose and code alike), except file
  names (``idled.service``, ``idled.toml``: a last part that is a file suffix) and names inside a path or a
  host name (``/var/lib/idled.old``, ``cores.idled.internal``: preceded by ``/``, ``.``, ``-``);
* in every docstring of every module of ``idled/`` (the module's, its classes' and its functions'), every
  dotted name, resolved in the places the module's author would mean: the module itself (what it defines
  or imports: ``Health.access``, ``trio.current_time``), then its package and each package above it
  (``users.user_frame`` in ``idled.server.roles.plane`` is ``idled.server.roles.users.user_frame``; ``ops.metrics``
  anywhere is ``idled.ops.metrics``). A name whose first part is found in none of these is not a name of
  idled (``e.g``, ``summary.json``, a local variable's ``entry.place``) and is left alone; a name whose
  first part is found must resolve to the end in one of them.

An attribute a class declares but does not hold at class level (a dataclass field without a default, an
annotated or ``self.x = ...`` instance attribute, a slot) counts as found; what follows it cannot be
checked statically and is accepted. Local files and imports only: no daemon, about a second.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import idled
from idled.protocol.websocket import SUBPROTOCOL

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "idled"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MODULES = sorted(PACKAGE.rglob("*.py"))

# A dotted identifier not inside a path, a host name or a longer dotted word.
_DOTTED = re.compile(r"(?<![\w./:-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
# Last parts that make a dotted word a file name, not a code name (idled.service, summary.json).
FILE_SUFFIXES = frozenset({
    "py", "json", "jsonl", "md", "toml", "yml", "yaml", "png", "svg", "pem", "crt", "csr", "sock", "seg",
    "service", "socket", "timer", "conf", "zip", "txt", "csv", "html", "gz", "tar", "old", "parquet", "spec",
})


@dataclass(frozen=True, slots=True)
class Mention:
    """A dotted name as written, where it was written, and where to look its first part up."""

    where: str  # path:line, relative to the repository's root
    name: str
    contexts: tuple[object, ...]


class _Declared:
    """An attribute a class declares for its instances: found, and nothing after it can be checked."""


_DECLARED = _Declared()


def _declares(cls: type, attribute: str) -> bool:
    """Does ``cls`` (or a base) declare an instance attribute it holds no class-level value for?"""
    for klass in cls.__mro__:
        if attribute in getattr(klass, "__annotations__", {}) or attribute in getattr(klass, "__slots__", ()):
            return True
        if attribute in getattr(klass, "__dataclass_fields__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(attribute)}\s*(?::[^=\n]*)?=", source):
            return True
    return False


def _submodule(package: types.ModuleType, part: str) -> types.ModuleType | None:
    qualified = f"{package.__name__}.{part}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise  # the submodule exists and its own import failed: a real error, not a stale name
        return None


def candidates(owner: object, part: str) -> list[object]:
    """What ``owner.part`` may mean: the attribute, a package's submodule of that name (a package may export
    a function named as one of its modules: ``idled.protocol.messages``), a declared instance attribute."""
    if isinstance(owner, _Declared):
        return [owner]
    found: list[object] = []
    if isinstance(owner, types.ModuleType) and hasattr(owner, "__path__"):
        if (module := _submodule(owner, part)) is not None:
            found.append(module)
    try:
        value = getattr(owner, part)
    except AttributeError:
        pass
    else:
        if all(value is not other for other in found):
            found.append(value)
    if not found and isinstance(owner, type) and _declares(owner, part):
        found.append(_DECLARED)
    return found


def _follow(target: object, parts: list[str], instance_of_module: bool) -> bool:
    """Can ``parts`` be followed from ``target``? With ``instance_of_module``, a module's first missing part
    may also be an attribute of a class the module defines (``link.touch``: ``link`` a variable holding the
    module's ``GatewayLink``), the way prose names a method by its receiver."""
    if not parts:
        return True
    if any(_follow(nxt, parts[1:], False) for nxt in candidates(target, parts[0])):
        return True
    if instance_of_module and isinstance(target, types.ModuleType):
        classes = [c for c in vars(target).values() if isinstance(c, type) and c.__module__ == target.__name__]
        return any(_follow(cls, parts, False) for cls in classes)
    return False


def resolves(name: str, contexts: tuple[object, ...]) -> bool | None:
    """True if ``name`` resolves from one of ``contexts``, False if its first part is found but the rest is
    not, None if its first part is found nowhere (not a name of idled's)."""
    head, *rest = name.split(".")
    found_head = False
    for context in contexts:
        for target in candidates(context, head):
            found_head = True
            if _follow(target, rest, instance_of_module=not name.startswith("idled.")):
                return True
    return False if found_head else None


def _is_file_name(name: str) -> bool:
    """A file's name (a last part that is a file suffix), or a name on the wire that looks dotted."""
    return name.rsplit(".", 1)[1] in FILE_SUFFIXES or name in WIRE_NAMES


WIRE_NAMES = {SUBPROTOCOL}  # the WebSocket subprotocol, idled.v1: a name on the wire, not in the code

_TOP = types.SimpleNamespace(idled=idled)  # where a fully dotted idled.x.y starts


class _Imported:
    """The libraries already imported (``trio.Event`` when a sibling module ``idled.client.trio`` shadows the
    name): only those, so that no word of prose imports a module with side effects."""

    def __getattr__(self, name: str) -> object:
        try:
            return sys.modules[name]
        except KeyError:
            raise AttributeError(name) from None


_LIBRARIES = _Imported()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
    return {a.arg for a in every}


def docstring_mentions(path: Path) -> list[Mention]:
    """The dotted names in every docstring of one module of idled, each with the places it may mean."""
    name = module_name(path)
    packages = name.split(".")
    if path.name != "__init__.py":
        packages = packages[:-1]
    # A __main__ runs its program on import: its names are looked up from its package only.
    own = () if path.name == "__main__.py" else (importlib.import_module(name),)
    contexts: tuple[object, ...] = (
        *own,
        *(importlib.import_module(".".join(packages[:n])) for n in range(len(packages), 0, -1)),
        _TOP,
        _LIBRARIES,
    )
    found: list[Mention] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            continue
        literal = body[0].value
        text = literal.value
        if not isinstance(text, str):
            continue
        # In a function's docstring a parameter's name is the argument (``spark.master``: a conf key read
        # from the `spark` given), not the module of that name: not checked.
        parameters = _parameters(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        for match in _DOTTED.finditer(text):
            name = match.group(1)
            if _is_file_name(name) or name.split(".", 1)[0] in parameters:
                continue
            line = literal.lineno + text.count("\n", 0, match.start())
            found.append(Mention(f"{path.relative_to(ROOT)}:{line}", name, contexts))
    return found


def page_mentions(path: Path) -> list[Mention]:
    """The fully dotted ``idled.`` names of one page."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in _DOTTED.finditer(line):
            name = match.group(1)
            if name.startswith("idled.") and not _is_file_name(name):
                found.append(Mention(f"{path.relative_to(ROOT)}:{number}", name, (_TOP,)))
    return found


def unresolved(mentions: list[Mention]) -> list[str]:
    return [f"{m.where}: {m.name}" for m in mentions if resolves(m.name, m.contexts) is False]


def test_every_dotted_name_in_a_docstring_resolves() -> None:
    mentions = [m for path in MODULES for m in docstring_mentions(path)]
    assert sum(m.name.startswith("idled.") for m in mentions) > 100, "the docstring scan finds nothing"
    bad = unresolved(mentions)
    assert not bad, "docstrings name code that does not exist:\n" + "\n".join(bad)


def test_every_idled_name_on_a_page_resolves() -> None:
    mentions = [m for page in PAGES for m in page_mentions(page)]
    assert len(mentions) > 20, "the page scan finds nothing"
    bad = unresolved(mentions)
    assert not bad, "pages name code that does not exist:\n" + "\n".join(bad)


# -- the resolver itself ----------------------------------------------------------------------------------


def test_the_resolver_follows_modules_attributes_and_declared_fields() -> None:
    from idled.server.roles import plane

    contexts = (plane, importlib.import_module("idled.server.roles"), importlib.import_module("idled.server"), idled,
                _TOP)
    assert resolves("idled.server.roles.users.run_user", contexts) is True  # module, submodule, function
    assert resolves("users.run_user", contexts) is True  # relative to the module's package
    assert resolves("ops.health.Health", contexts) is True  # relative to a package above
    assert resolves("trio.current_time", contexts) is True  # what the module imports
    assert resolves("idled.protocol.messages.Login.name", contexts) is True  # a slotted field; messages is
    # both a function of idled.protocol and its module
    assert resolves("users.user_frame", contexts) is False  # moved: users has no user_frame
    assert resolves("idled.server.nosuchmodule", contexts) is False
    assert resolves("e.g", contexts) is None  # not a name of idled: left alone
    assert resolves("entry.place", contexts) is None


@pytest.mark.parametrize("text, names", [
    ("see ``idled.server.roles.users.run_user`` (and `idled.door`).",
     ["idled.server.roles.users.run_user", "idled.door"]),
    ("mv /var/lib/idled.old-1 and /tmp/idled.zip", []),
    ("the unit idled.service, the file summary.json", []),
    ("e.g. idled.log.eventlog.EventLog.recover()", ["e.g", "idled.log.eventlog.EventLog.recover"]),
])
def test_the_scan_finds_names_and_skips_paths_and_files(text: str, names: list[str]) -> None:
    assert [m.group(1) for m in _DOTTED.finditer(text) if not _is_file_name(m.group(1))] == names
