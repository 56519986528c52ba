"""The recipes that ship with swift-vora: find them by name, list them, copy one out (`swift-vora recipes`).

    swift-vora recipes                      # name, hardware and what each recipe is for
    swift-vora recipes show h200x1          # print one
    swift-vora recipes cp h200x1 my.yaml    # copy one out to edit (never overwrites)
    swift-vora train h200x1 --dry-run       # `train` takes a shipped recipe's name as well as a path

The recipes live in the repository's `recipes/` folder; the wheel carries the same files inside the package
(`swift_vora/recipes/`, see pyproject.toml), so a pip-installed swift-vora finds them without a checkout. A path
that does not exist but names a shipped recipe (`recipes/3060x4.yaml` typed outside the repository) resolves to
the shipped one, so the commands in the documentation work from any directory.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
SUFFIXES = ('.yaml', '.yml')


def recipes_dir() -> Optional[str]:
    """The folder of shipped recipes: inside the installed package (wheel), else the checkout's `recipes/`."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(package_dir, 'recipes'), os.path.join(os.path.dirname(package_dir), 'recipes')):
        if os.path.isdir(candidate):
            return candidate
    return None


def shipped_recipes() -> Dict[str, str]:
    """name -> path of every shipped recipe, sorted by name."""
    folder = recipes_dir()
    if folder is None:
        return {}
    return {name[:-len(suffix)]: os.path.join(folder, name) for name in sorted(os.listdir(folder))
            for suffix in SUFFIXES if name.endswith(suffix)}


def recipe_name(text: str) -> str:
    base = os.path.basename(text)
    for suffix in SUFFIXES:
        if base.endswith(suffix):
            return base[:-len(suffix)]
    return base


def resolve_recipe(text: str) -> str:
    """A recipe argument -> a file: an existing path as given, else a shipped recipe of that name (`h200x1`,
    `h200x1.yaml`, `recipes/h200x1.yaml`). Raises FileNotFoundError naming the shipped recipes."""
    if os.path.isfile(text):
        return text
    shipped = shipped_recipes()
    parent = os.path.dirname(text)
    if parent in ('', 'recipes') and recipe_name(text) in shipped:
        return shipped[recipe_name(text)]
    known = ', '.join(shipped) or 'none found'
    raise FileNotFoundError(f'{text}: no such recipe file, and not the name of a shipped recipe ({known}; '
                            '`swift-vora recipes` lists them)')


def describe(path: str) -> Dict[str, str]:
    """The first header line of a recipe (`name: what it is for`) and its `Hardware:` line."""
    summary, hardware = '', ''
    with open(path, encoding='utf-8') as f:
        for line in f:
            if not line.startswith('#'):
                break
            text = line[1:].strip()
            if not summary and text:
                summary = text.split(':', 1)[1].strip() if ':' in text else text
            elif text.startswith('Hardware:') and not hardware:
                hardware = text[len('Hardware:'):].strip()
    return {'summary': _first_sentence(summary), 'hardware': _first_sentence(hardware)}


def _first_sentence(text: str) -> str:
    return text.split('. ', 1)[0].rstrip('.') if text else text


def register_commands(subparsers) -> None:
    p = subparsers.add_parser('recipes', help='list the shipped recipes, print one, or copy one out to edit',
                              description=__doc__.split('\n\n')[0])
    sub = p.add_subparsers(dest='recipes_command', metavar='ACTION')
    ls = sub.add_parser('ls', help='list the shipped recipes (the default)')
    ls.add_argument('--json', action='store_true', help='one JSON object: name -> path, summary, hardware')
    show = sub.add_parser('show', help='print a shipped recipe')
    show.add_argument('name', help='recipe name (`swift-vora recipes` lists them)')
    cp = sub.add_parser('cp', help='copy a shipped recipe to a file or folder (never overwrites)')
    cp.add_argument('name', help='recipe name (`swift-vora recipes` lists them)')
    cp.add_argument('dest', nargs='?', default='.', help='file or existing folder (default: ./NAME.yaml)')
    p.add_argument('--json', action='store_true', help=argparse.SUPPRESS)  # `recipes --json` = `recipes ls --json`
    p.set_defaults(handler=cmd_recipes)


def _err(msg: str) -> None:
    print(f'swift-vora recipes: {msg}', file=sys.stderr)


def _lookup(name: str) -> Optional[str]:
    path = shipped_recipes().get(recipe_name(name))
    if path is None:
        _err(f'no shipped recipe named {name!r} (shipped: {", ".join(shipped_recipes()) or "none found"})')
    return path


def cmd_recipes(args) -> int:
    action = args.recipes_command or 'ls'
    if action == 'ls':
        return _list(bool(getattr(args, 'json', False)))
    path = _lookup(args.name)
    if path is None:
        return EXIT_USAGE
    if action == 'show':
        with open(path, encoding='utf-8') as f:
            sys.stdout.write(f.read())
        return EXIT_OK
    dest = args.dest
    if os.path.isdir(dest):
        dest = os.path.join(dest, os.path.basename(path))
    if os.path.exists(dest):
        _err(f'{dest} exists; not overwritten (give another destination)')
        return EXIT_USAGE
    parent = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(parent):
        _err(f'{dest}: folder {parent} does not exist')
        return EXIT_USAGE
    from .outputs import flush_stdout, staged
    with open(path, encoding='utf-8') as f:
        text = f.read()
    # Staged: a copy that fails half-way (a full disk) leaves no truncated recipe for `train` to accept later.
    with staged() as stage:
        stage.write_text(dest, text, [path], 'recipe copy')
        print(f'copied {recipe_name(path)} to {dest}; train it with: swift-vora train {dest} --dry-run')
        flush_stdout()
    return EXIT_OK


def _list(as_json: bool) -> int:
    shipped = shipped_recipes()
    if not shipped:
        _err('no shipped recipes found (the package was installed without its recipes/ folder)')
        return EXIT_INVALID
    rows: List[Dict[str, str]] = [{'name': name, 'path': path, **describe(path)} for name, path in shipped.items()]
    if as_json:
        import json
        print(json.dumps({r['name']: {k: r[k] for k in ('path', 'summary', 'hardware')} for r in rows}, indent=2))
        return EXIT_OK
    width = max(len(r['name']) for r in rows)
    for r in rows:
        print(f'{r["name"]:<{width}}  {r["summary"]}')
        if r['hardware']:
            print(f'{"":<{width}}  hardware: {r["hardware"]}')
    print(f'\n{len(rows)} recipes in {recipes_dir()}. `swift-vora recipes cp NAME` copies one out; '
          '`swift-vora train NAME --dry-run` plans it.')
    return EXIT_OK
