"""scripts/gpu/slim_te.py: the fat-binary walk over libtransformer_engine.so's .nv_fatbin section, on synthetic fat
binaries (the real wheel is 171 MiB and not in the repository: docs/backends.md has its measured result). Kept
entries stay byte-identical, the others' payloads become zeros with their headers untouched, and anything that does
not parse stops before a byte is changed."""
import glob
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts', 'gpu'))
import slim_te  # noqa: E402


def entry(kind, arch, payload):
    header = struct.pack('<HHIQ', kind, 0x0101, 64, len(payload)) + bytes(12) + struct.pack('<I', arch) + bytes(32)
    assert len(header) == 64
    return header + payload


def fatbin(*entries):
    body = b''.join(entries)
    return struct.pack('<IHHQ', slim_te.FATBIN_MAGIC, 1, 16, len(body)) + body


def section():
    a = fatbin(entry(2, 90, b'\x11' * 40), entry(2, 100, b'\x22' * 48), entry(1, 90, b'\x33' * 24))
    b = fatbin(entry(2, 75, b'\x44' * 16), entry(2, 90, b'\x66' * 8))
    return bytearray(a + bytes(8) + b)  # alignment padding between fat binaries


def test_other_architectures_are_zeroed_and_the_kept_ones_untouched():
    data = section()
    before = bytes(data)
    stats = slim_te.zero_other_archs(data, 0, len(data), {'elf': {90}, 'ptx': {90}})
    assert stats['elf_sm90'] == {'entries': 2, 'bytes': 48} and stats['ptx_sm90'] == {'entries': 1, 'bytes': 24}
    assert stats['elf_sm100 (zeroed)']['bytes'] == 48 and stats['elf_sm75 (zeroed)']['bytes'] == 16
    assert len(data) == len(before)
    assert data.count(b'\x22') == 0 and data.count(b'\x44') == 0
    assert data.count(b'\x11') == 40 and data.count(b'\x33') == 24 and data.count(b'\x66') == 8
    assert list(slim_te.walk(data, 0, len(data))) == list(slim_te.walk(bytearray(before), 0, len(before)))


def test_keeping_no_sass_is_refused():
    data = section()
    with pytest.raises(ValueError, match='no SASS'):
        slim_te.zero_other_archs(data, 0, len(data), {'elf': {86}, 'ptx': set()})


def test_what_does_not_parse_is_refused_before_any_change():
    data = section()
    data[16:18] = struct.pack('<H', 7)  # the first entry's kind
    before = bytes(data)
    with pytest.raises(ValueError, match='not a fat binary entry'):
        slim_te.zero_other_archs(data, 0, len(data), {'elf': {90}, 'ptx': {90}})
    assert bytes(data) == before
    junk = bytearray(b'\x01' * 16) + section()
    with pytest.raises(ValueError, match='neither a fat binary'):
        list(slim_te.walk(junk, 0, len(junk)))


def test_elf_sections_are_found():
    with open(sys.executable, 'rb') as f:
        data = f.read()
    if data[:4] != b'\x7fELF':
        pytest.skip('the interpreter is not an ELF file')
    assert slim_te.find_section(data, '.text') is not None
    assert slim_te.find_section(data, '.nv_fatbin') is None
    with pytest.raises(ValueError, match='ELF64'):
        slim_te.find_section(b'MZ' + bytes(100), '.text')


def test_a_repacked_wheel_keeps_a_record_pip_accepts(tmp_path):
    """slim_wheel.repack, which both slimming scripts write through: removed files leave RECORD, a replaced file gets
    its new hash and size, everything else is byte-identical; pip's own RECORD check (hash, size) passes."""
    import base64
    import hashlib
    import zipfile

    import slim_wheel

    def line(name, data):
        return f'{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()},' \
               f'{len(data)}\n'
    files = {'pkg/keep.py': b'x = 1\n', 'pkg/big.so': b'\x01' * 64, 'pkg/drop/me.txt': b'gone'}
    src = tmp_path / 'in' / 'pkg-1.0-py3-none-any.whl'
    src.parent.mkdir()
    with zipfile.ZipFile(src, 'w') as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr('pkg-1.0.dist-info/RECORD', ''.join(line(n, d) for n, d in files.items())
                   + 'pkg-1.0.dist-info/RECORD,,\n')
    dst = slim_wheel.repack(str(src), str(tmp_path / 'out'), 'test', remove={'pkg/drop/me.txt'},
                            replace={'pkg/big.so': bytes(64)})
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = z.read('pkg-1.0.dist-info/RECORD').decode()
        assert names == {'pkg/keep.py', 'pkg/big.so', 'pkg-1.0.dist-info/RECORD'}
        assert z.read('pkg/keep.py') == files['pkg/keep.py'] and z.read('pkg/big.so') == bytes(64)
    assert record == line('pkg/keep.py', files['pkg/keep.py']) + line('pkg/big.so', bytes(64)) \
        + 'pkg-1.0.dist-info/RECORD,,\n'
    with pytest.raises(SystemExit, match='OUT_DIR must differ'):
        slim_wheel.repack(str(src), str(src.parent), 'test')


def unsloth_slimming():
    """fetch_wheels.sh's --drop / --keep patterns for the unsloth wheel (its continuation lines joined)."""
    import re
    import shlex
    with open(os.path.join(os.path.dirname(slim_te.__file__), 'fetch_wheels.sh'), encoding='utf-8') as f:
        script = f.read().replace('\\\n', ' ')
    line = next(ln for ln in script.splitlines() if 'slim_wheel.py' in ln and 'unsloth-2026' in ln)
    words = shlex.split(line)
    patterns = {'--drop': [], '--keep': []}
    for flag, value in zip(words, words[1:]):
        if flag in patterns:
            patterns[flag].append(value)
    assert patterns['--drop'] and not re.search(r'unsloth(_zoo)?/', ' '.join(patterns['--drop']))
    return patterns['--drop'], patterns['--keep']


# What the unsloth package reads from the wheel's `studio/` folder by path (lazily, for its decision models):
# unsloth/models/_decision_common.py (_VENDORED_LAYA) and unsloth/models/decision_gguf.py (_CONTRACT_FILE).
READ_BY_UNSLOTH = ('studio/backend/vendor/laya/__init__.py', 'studio/backend/core/systemone/gguf_export_contract.py')


def test_the_unsloth_slimming_drops_studio_but_what_unsloth_reads_from_it():
    """The Studio web UI and server leave the carried unsloth wheel (9 of its 12 MiB: the Megatron pack and the
    kernel cache then fit one call); training code and the two files unsloth itself opens under studio/ stay."""
    import slim_wheel
    drop, keep = unsloth_slimming()

    def dropped(path):
        return slim_wheel._match(path, drop) and not slim_wheel._match(path, keep)
    assert dropped('studio/backend/main.py') and dropped('studio/frontend/dist/index.html')
    assert not any(dropped(p) for p in READ_BY_UNSLOTH)
    assert not dropped('unsloth/models/loader.py') and not dropped('unsloth_cli/config.py')


def test_the_slimmed_unsloth_wheel_holds_what_unsloth_opens_under_studio(tmp_path):
    """Every `studio` path the unsloth package builds from its own location is in the slimmed wheel: the one
    fetch_wheels.sh built for GPU calls where the checkout has it, else the pinned wheel the tests read
    (tests/moe_wheels.py) slimmed here with fetch_wheels.sh's own patterns."""
    import re
    import zipfile

    import moe_wheels
    import slim_wheel
    wheels = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(slim_te.__file__)), '..', '.whl',
                                           'unsloth', 'unsloth-*.whl')))
    if not wheels:
        pinned = moe_wheels.wheel('unsloth')
        if pinned is None:
            pytest.skip(moe_wheels.MISSING)
        drop, keep = unsloth_slimming()
        wheels = [slim_wheel.slim(pinned, str(tmp_path), drop, keep)]
    with zipfile.ZipFile(wheels[-1]) as z:
        names = set(z.namelist())
        sources = {n: z.read(n).decode('utf-8', 'replace') for n in names
                   if n.startswith('unsloth/') and n.endswith('.py')}
    assert not any(n.startswith('studio/frontend/') or n == 'studio/backend/main.py' for n in names)
    opened = [n for n, text in sources.items() if re.search(r'parents\[2\]\s*/\s*"studio"', text)]
    assert sorted(opened) == ['unsloth/models/_decision_common.py', 'unsloth/models/decision_gguf.py'], opened
    assert all(p in names for p in READ_BY_UNSLOTH)
