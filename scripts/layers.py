"""How the rooms of ``src/trainport`` import each other, against the layer map.

A room is a top-level package or module of ``trainport`` (``host``, ``jobs``, ``spec``,
...). The layer map below says which room may import which: a room imports only rooms of
lower layers. The script reads the source (it imports nothing of trainport) and reports:

- circles: groups of modules that import each other at run time (imports under
  ``if TYPE_CHECKING:`` run never, so they close no circle);
- up-imports: imports, typed ones included, from a room into a room of its own or a
  higher layer;
- the climbs of a CreateTrainingJob: the calls reachable from ``JobService.create`` until
  the job's record is stored (``JobService._launch`` and on are the job's start), found by
  reading the calls a function makes to names it imports or defines; each call from a
  room into a room of a higher layer is a climb. Calls on objects whose type the reader
  cannot see (``self.store.exists``) are not followed, so the walk is a lower bound; a
  function that reads a module's table of functions (a tuple of checks) may call each.

Run: ``python scripts/layers.py [--verbose]``; exits 1 when there is a circle or an
up-import, so it can guard a check.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "trainport"

#: Bottom to top; a room imports only rooms of lower layers.
LAYERS: list[set[str]] = [
    {"errors"},
    {"instances", "tags", "yamldoc", "servicemodel"},
    {"config"},
    {"store", "data", "distributed"},
    {"spec"},
    {"runners"},
    {"host"},
    {"placement"},
    {"jobs"},
    {"client", "jobfile", "follow"},
    {"tuning", "select"},
    {"server", "demo"},
    {"cli"},
]
#: Where a CreateTrainingJob's walk starts, and the calls after which the job exists.
START = ("trainport.jobs.service", "JobService.create")
JOB_EXISTS = {("trainport.jobs.service", "JobService._launch")}


def layer_of(room: str) -> int:
    for i, rooms in enumerate(LAYERS):
        if room in rooms:
            return i
    raise SystemExit(f"scripts/layers.py: room {room!r} is in no layer of LAYERS; add it")


def room_of(module: str) -> str:
    return module.split(".")[1] if "." in module else module


class Module:
    """One source file: its imports and the functions it defines."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.is_package = path.name == "__init__.py"
        # (target module, typing only)
        self.imports: list[tuple[str, bool]] = []
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        self.functions[f"{node.name}.{item.name}"] = item


def load(src: Path) -> dict[str, Module]:
    modules = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = Module(".".join(parts), path)
    return modules


def _typing_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def scan_imports(module: Module, modules: dict[str, Module]) -> dict[str, str]:
    """Fill ``module.imports``; returns the names bound to trainport modules or objects
    (name -> "module" or "module:object") anywhere in the file, for the call walk."""
    bound: dict[str, str] = {}

    def visit(node: ast.AST, typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _typing_only(child):
                visit(child, True)
                continue
            if isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                base = child.module
                if base == PACKAGE or base.startswith(PACKAGE + "."):
                    for alias in child.names:
                        full = f"{base}.{alias.name}"
                        if full in modules:
                            module.imports.append((full, typing))
                            bound[alias.asname or alias.name] = full
                        else:
                            module.imports.append((base, typing))
                            bound[alias.asname or alias.name] = f"{base}:{alias.name}"
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith(PACKAGE + "."):
                        module.imports.append((alias.name, typing))
                        if alias.asname:
                            bound[alias.asname] = alias.name
            visit(child, typing)

    visit(module.tree, False)
    return bound


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected groups (more than one module) of the run-time import graph."""
    graph = {
        name: sorted({t for t, typing in m.imports if not typing and t in modules and t != name})
        for name, m in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return sorted(found)


def up_imports(modules: dict[str, Module]) -> list[tuple[str, str]]:
    ups = set()
    for name, m in modules.items():
        here = room_of(name)
        for target, _ in m.imports:
            there = room_of(target)
            if there != here and there != PACKAGE and layer_of(there) >= layer_of(here):
                ups.add((name, target))
    return sorted(ups)


def room_edges(modules: dict[str, Module]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, m in modules.items():
        for target, _ in m.imports:
            if room_of(target) not in (room_of(name), PACKAGE):
                edges[room_of(name)].add(room_of(target))
    return edges


def climbs(
    modules: dict[str, Module], bound: dict[str, dict[str, str]]
) -> tuple[list[str], list[tuple[str, str]]]:
    """The functions reachable from START (depth first) and the calls among them that
    climb a layer."""
    seen: set[tuple[str, str]] = set()
    order: list[str] = []
    up: list[tuple[str, str]] = []

    def resolve(mod: str, ref: str) -> tuple[str, str] | None:
        """A "module:object" reference -> a function (or a class's constructor)."""
        target = modules.get(mod)
        if target is None:
            return None
        if ref in target.functions:
            return mod, ref
        if ref in target.classes:
            for init in ("__init__", "__post_init__"):
                if f"{ref}.{init}" in target.functions:
                    return mod, f"{ref}.{init}"
            return None
        # re-exported by a package or module
        again = bound[mod].get(ref)
        if again and ":" in again:
            m2, r2 = again.split(":", 1)
            return resolve(m2, r2) if (m2, r2) != (mod, ref) else None
        return None

    def callee(mod: str, qual: str, call: ast.Call) -> tuple[str, str] | None:
        here = modules[mod]
        func = call.func
        if isinstance(func, ast.Name):
            name = func.id
            if name in here.functions or name in here.classes:
                return resolve(mod, name)
            ref = bound[mod].get(name)
            if ref and ":" in ref:
                return resolve(*ref.split(":", 1))
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self" and "." in qual:
                cls = qual.split(".")[0]
                key = f"{cls}.{func.attr}"
                return (mod, key) if key in here.functions else None
            if owner in here.classes:
                key = f"{owner}.{func.attr}"
                return (mod, key) if key in here.functions else None
            ref = bound[mod].get(owner)
            if ref is None:
                return None
            if ":" in ref:  # Class.method on an imported class
                m2, obj = ref.split(":", 1)
                key = f"{obj}.{func.attr}"
                target = modules.get(m2)
                return (m2, key) if target and key in target.functions else None
            return resolve(ref, func.attr)
        return None

    def tables(mod: str) -> dict[str, list[str]]:
        """Module-level names bound to a table of functions (a tuple of checks, say): a
        function that reads the table may call any of them."""
        found: dict[str, list[str]] = {}
        for node in modules[mod].tree.body:
            targets: list[ast.expr] = [node.target] if isinstance(node, ast.AnnAssign) else []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            value = getattr(node, "value", None)
            if value is None:
                continue
            refs = [
                n.id
                for n in ast.walk(value)
                if isinstance(n, ast.Name) and n.id in modules[mod].functions
            ]
            for target in targets:
                if isinstance(target, ast.Name) and refs:
                    found[target.id] = refs
        return found

    def walk(mod: str, qual: str) -> None:
        seen.add((mod, qual))
        order.append(f"{mod}:{qual}")
        table = tables(mod)
        for node in ast.walk(modules[mod].functions[qual]):
            if isinstance(node, ast.Name) and node.id in table:
                for ref in table[node.id]:
                    if (mod, ref) not in seen:
                        walk(mod, ref)
                continue
            if not isinstance(node, ast.Call):
                continue
            found = callee(mod, qual, node)
            if found is None or found in JOB_EXISTS:
                continue
            if layer_of(room_of(found[0])) > layer_of(room_of(mod)):
                step = (f"{mod}:{qual}", f"{found[0]}:{found[1]}")
                if step not in up:
                    up.append(step)
            if found not in seen:
                walk(*found)

    walk(*START)
    return order, up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="list every import and call")
    args = parser.parse_args()
    modules = load(SRC)
    bound = {name: scan_imports(m, modules) for name, m in modules.items()}
    rooms = {room_of(n) for n in modules if n != PACKAGE}
    edges = room_edges(modules)
    found = circles(modules)
    ups = up_imports(modules)
    order, up = climbs(modules, bound)
    walked = {room_of(f.split(":")[0]) for f in order}
    print(f"rooms: {len(rooms)}, room-to-room imports: {sum(len(v) for v in edges.values())}")
    print(f"circles: {len(found)}")
    for group in found:
        print("  " + " <-> ".join(group))
    up_rooms = sorted({(room_of(a), room_of(b)) for a, b in ups})
    print(f"up-imports: {len(ups)} (room to room: {len(up_rooms)})")
    for a, b in ups:
        print(f"  {a} -> {b}")
    print(
        f"CreateTrainingJob from JobService.create: {len(order)} functions in "
        f"{len(walked)} rooms, {len(up)} climbs"
    )
    for a, b in up:
        print(f"  {a} -> {b}")
    if args.verbose:
        print("room imports:")
        for room in sorted(edges):
            print(f"  {room} -> {', '.join(sorted(edges[room]))}")
        print("walk:")
        for f in order:
            print(f"  {f}")
    return 1 if found or ups else 0


if __name__ == "__main__":
    sys.exit(main())
