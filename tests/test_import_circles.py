"""No import circles between the modules of swift_vora, counting the imports made inside functions too.

A circle (module A imports B, which imports ... A) is a room that cannot be understood, tested or moved without the
others; imports deferred into a function hide it without removing it. This test reads every module's source (AST,
nothing is imported) and follows each `import swift_vora...` and `from .x import y`, at module level or inside a
function; importing a module imports the packages above it first, so those count as imports too. Imports under
`if TYPE_CHECKING:` never run and are left out, as are names resolved at run time (importlib.import_module).

    python tests/test_import_circles.py     # the circles, each with the imports that close it
"""
from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = 'swift_vora'


def modules(root: str = REPO) -> Dict[str, str]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(files):
            if not name.endswith('.py'):
                continue
            parts = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
            if parts[-1] == '__init__':
                parts = parts[:-1]
            out['.'.join(parts)] = os.path.join(folder, name)
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def _imported_names(tree: ast.AST, module: str, is_package: bool, known: Set[str]) -> List[str]:
    """Dotted names of the modules that `module` imports anywhere in its body (functions included): for
    `from P import n`, P.n where that is a module, else P (n is then a name that P defines)."""
    found: List[str] = []
    base = module.split('.') if is_package else module.split('.')[:-1]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - (node.level - 1)]
                target = '.'.join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            for alias in node.names:
                found.append(f'{target}.{alias.name}' if f'{target}.{alias.name}' in known else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: str = REPO) -> Dict[str, Set[str]]:
    """Module -> the package modules it imports. Importing a module first runs the packages above it, except those
    the importer is inside (they are already running), so those count as imported too."""
    files = modules(root)
    graph: Dict[str, Set[str]] = {}
    for name, path in files.items():
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), path)
        edges: Set[str] = set()
        for target in _imported_names(tree, name, path.endswith('__init__.py'), set(files)):
            if target not in files:
                continue
            parts = target.split('.')
            for i in range(1, len(parts) + 1):
                ancestor = '.'.join(parts[:i])
                inside = name == ancestor or name.startswith(ancestor + '.')
                if ancestor in files and not inside:
                    edges.add(ancestor)
        graph[name] = edges
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted, largest first."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found, key=lambda g: (-len(g), g))


def describe(group: List[str], graph: Dict[str, Set[str]]) -> str:
    members = set(group)
    ties = [f'  {a} -> {b}' for a in group for b in sorted(graph[a] & members)]
    return f'{len(group)} modules: {", ".join(group)}\n' + '\n'.join(ties)


def test_the_scan_sees_function_local_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'sub' / '__init__.py').write_text('from .a import f\n')
    (pkg / 'sub' / 'a.py').write_text('def f():\n    from ..b import g\n    return g\n')
    (pkg / 'b.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import h\n'
                              'def g():\n    from .sub import a\n')
    (pkg / 'c.py').write_text('from .b import g\n')
    graph = import_graph(str(tmp_path))
    assert graph[f'{PACKAGE}.sub.a'] == {f'{PACKAGE}.b'}
    assert f'{PACKAGE}.c' not in graph[f'{PACKAGE}.b']  # TYPE_CHECKING: never runs
    assert circles(graph) == [[f'{PACKAGE}.b', f'{PACKAGE}.sub', f'{PACKAGE}.sub.a']]


def test_no_import_circles():
    graph = import_graph()
    found = circles(graph)
    assert not found, 'import circles:\n' + '\n'.join(describe(g, graph) for g in found)


def reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_plan_flows_into_the_launch_never_back():
    """swift_vora.plan decides; the backends launch what it decided and the CLI composes the two: nothing the
    planner imports, directly or not, is a backend or the CLI."""
    graph = import_graph()
    for module in (m for m in graph if m == 'swift_vora.plan' or m.startswith('swift_vora.plan.')):
        above = {m for m in reachable(graph, module) if m.startswith(('swift_vora.backends', 'swift_vora.cli'))}
        assert not above, f'{module} reaches {sorted(above)}'


if __name__ == '__main__':
    g = import_graph()
    groups = circles(g)
    for group in groups:
        print(describe(group, g))
    print(f'{len(groups)} circles among {len(g)} modules')
