"""The backends room's command: `swift-vora kernel-cache export|import`, the compiled-kernel caches carried to a fresh
machine (swift_vora/backends/kernel_cache_archive.py says what travels and why).

Exit 0; 1 when the caches are empty (export) or the archive is incomplete or foreign (import); 2 on usage errors.
"""
from __future__ import annotations

import sys

from ..errors import EXIT_OK, EXIT_USAGE
from ..json_output import dumps


def register_commands(subparsers) -> None:
    k = subparsers.add_parser(
        'kernel-cache', help='export / import the compiled-kernel caches (Triton, inductor) to start a fresh machine '
        'warm',
        description='The first optimizer step of the Unsloth MoE path compiles and autotunes Triton kernels: minutes '
        'on an empty cache, seconds on a warm one. `export` writes the caches swift-vora keeps (SWIFT_VORA_CACHE_DIR, '
        'default ~/.cache/swift_vora) to one xz file; `import` fills this machine\'s caches from it. Entries are '
        'keyed on versions and GPU: an archive from other versions is harmless, and import says so.')
    verbs = k.add_subparsers(dest='kernel_cache_verb', metavar='VERB')
    e = verbs.add_parser('export', help='write the caches to FILE (or FILE.part0, .part1, ...)')
    e.add_argument('file')
    e.add_argument('--part-mib', type=float, default=None,
                   help='split into parts of at most this many MiB (for transfers that limit file sizes)')
    e.add_argument('--json', action='store_true', help='print JSON')
    e.set_defaults(handler=cmd_export)
    i = verbs.add_parser('import', help='fill this machine\'s caches from FILE (or FILE.part0, .part1, ...)')
    i.add_argument('file')
    i.add_argument('--json', action='store_true', help='print JSON')
    i.set_defaults(handler=cmd_import)
    k.set_defaults(handler=lambda args: _usage(k))


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def cmd_export(args) -> int:
    from . import kernel_cache_archive as archive
    r = archive.export(args.file, part_mib=args.part_mib)
    print(dumps(r, indent=2) if args.json else archive.describe_export(r))
    return EXIT_OK


def cmd_import(args) -> int:
    from . import kernel_cache_archive as archive
    r = archive.import_(args.file)
    print(dumps(r, indent=2) if args.json else archive.describe_import(r))
    return EXIT_OK
