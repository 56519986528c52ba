"""scripts/gpu/wheel_pack.py: every wheel set a GPU call needs in one xz archive of wheels re-stored without
compression. What a user of the GPU scripts relies on: what the archive unpacks installs exactly what the original
wheels install; the Transformer Engine core comes out ready for setup_megatron.sh (no parts needed); nothing that
was altered, added or aimed outside the repository is written; a bad input names its file. Small fake wheels stand
in for the real ones (the real sets: 33.7 and 55.7 MiB packed, measured in docs/runs/gpu-calls.md and
docs/runs/benchmarks-log.md)."""
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest
from test_gpu_setup_megatron import CORE, sha256, write_wheel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'scripts', 'gpu'))
import wheel_pack  # noqa: E402

SETUP_MEGATRON = os.path.join(REPO, 'scripts', 'gpu', 'setup_megatron.sh')


@pytest.fixture
def root(tmp_path):
    """A checkout as fetch_wheels.sh leaves it: .whl/swift (+ build/), .whl/megatron with SHA256SUMS, .te0 and .te1."""
    r = tmp_path / 'repo'
    (r / '.whl' / 'swift' / 'build').mkdir(parents=True)
    (r / '.whl' / 'megatron').mkdir(parents=True)
    text = 'x = 1\n' * 500  # compressible, as real code is
    write_wheel(r / '.whl' / 'swift' / 'alpha-1.0-py3-none-any.whl', 'alpha', '1.0',
                {'alpha/__init__.py': text, 'alpha/data.txt': 'payload\n'})
    write_wheel(r / '.whl' / 'swift' / 'py_spy-0.4-py3-none-any.whl', 'py_spy', '0.4', {'py_spy/__init__.py': ''})
    write_wheel(r / '.whl' / 'swift' / 'build' / 'hatchling-1.0-py3-none-any.whl', 'hatchling', '1.0',
                {'hatchling/__init__.py': ''})
    write_wheel(r / '.whl' / 'megatron' / 'transformer_engine-2.11.0-py3-none-any.whl', 'transformer_engine',
                '2.11.0', {'transformer_engine/__init__.py': 'META = True\n'})
    core = tmp_path / CORE
    write_wheel(core, 'transformer_engine_cu13', '2.11.0',
                {'transformer_engine/common/__init__.py': 'CORE = True\n'})
    data = core.read_bytes()
    half = len(data) // 2
    lines = [f'{sha256(core)}  {CORE}']
    for i, chunk in enumerate((data[:half], data[half:])):
        (r / f'.te{i}').mkdir()
        (r / f'.te{i}' / f'{CORE}.part{i}').write_bytes(chunk)
        lines.append(f'{hashlib.sha256(chunk).hexdigest()}  .te{i}/{CORE}.part{i}')
    (r / '.whl' / 'megatron' / 'SHA256SUMS').write_text('\n'.join(lines) + '\n')
    return r


def pip_install(wheel, target):
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', '--no-compile',
                    '--target', str(target), str(wheel)], check=True, capture_output=True, timeout=120)
    tree = {}
    for d, _, files in os.walk(target):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), target)
            with open(os.path.join(d, f), 'rb') as fh:
                tree[rel] = fh.read()
    # pip records where it installed from (direct_url.json, and its line in RECORD): the one difference allowed
    for rel in [r for r in tree if r.endswith('direct_url.json')]:
        del tree[rel]
    for rel in [r for r in tree if r.endswith('RECORD')]:
        tree[rel] = b''.join(line for line in tree[rel].splitlines(True) if b'direct_url.json' not in line)
    return tree


def test_what_the_archive_unpacks_installs_exactly_what_the_original_wheels_install(root, tmp_path, monkeypatch):
    out = tmp_path / 'pack' / 'wheels.tar.xz'
    r = wheel_pack.pack(str(root), ['swift', 'megatron'], [], str(out))
    assert r['members'] == 8  # 3 swift (build/ included) + 1 megatron + its SHA256SUMS + TE core, its sums, its source
    dest = tmp_path / 'machine'
    u = wheel_pack.unpack(str(out), str(dest))
    assert u['written'] == 8 and u['already_there'] == 0 and u['removed'] == []
    for rel in ('.whl/swift/alpha-1.0-py3-none-any.whl', '.whl/swift/build/hatchling-1.0-py3-none-any.whl',
                '.whl/megatron/transformer_engine-2.11.0-py3-none-any.whl'):
        unpacked = dest / rel
        with zipfile.ZipFile(unpacked) as z:  # stored, so that xz can compress across members
            assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        assert pip_install(unpacked, tmp_path / 'a' / rel) == pip_install(root / rel, tmp_path / 'b' / rel)
    assert (dest / '.whl/megatron/SHA256SUMS').read_bytes() == (root / '.whl/megatron/SHA256SUMS').read_bytes()
    # a second unpack on the same machine checks and keeps what is there
    again = wheel_pack.unpack(str(out), str(dest))
    assert again['written'] == 0 and again['already_there'] == 8
    # a wheel of an earlier pack in one of its sets is removed: two versions of a package stop `pip install *.whl`
    stale = dest / '.whl' / 'swift' / 'alpha-0.9-py3-none-any.whl'
    stale.write_bytes(b'old')
    assert wheel_pack.unpack(str(out), str(dest))['removed'] == ['.whl/swift/alpha-0.9-py3-none-any.whl']
    assert not stale.exists()
    # the same from inside the root (`unpack ... --root .`): the pack's own wheels are never taken for stale ones
    monkeypatch.chdir(dest)
    assert wheel_pack.unpack(str(out), '.')['removed'] == []
    assert (dest / '.whl/swift/alpha-1.0-py3-none-any.whl').is_file()


def test_setup_megatron_installs_the_packed_te_core_without_any_part(root, tmp_path):
    out = tmp_path / 'wheels.tar.xz'
    wheel_pack.pack(str(root), ['megatron'], [], str(out))
    dest = tmp_path / 'machine'
    wheel_pack.unpack(str(out), str(dest))
    assert not (dest / '.te0').exists()
    env = dict(os.environ, SWIFT_VORA_PYTHON=sys.executable,
               SWIFT_VORA_MEGATRON_WHEELS=str(dest / '.whl' / 'megatron'),
               SWIFT_VORA_TE_READY=str(dest / '.whl' / 'megatron-te'), SWIFT_VORA_TE_PARTS=str(dest),
               SWIFT_VORA_TE_WORK=str(tmp_path / 'work'), SWIFT_VORA_MEGATRON_SITE=str(tmp_path / 'site'))
    proc = subprocess.run(['bash', SETUP_MEGATRON, 'install'], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'from the wheel pack, checked' in proc.stdout
    site = tmp_path / 'site' / 'transformer_engine'
    assert (site / 'common' / '__init__.py').read_text() == 'CORE = True\n'  # the core wheel's file
    assert (site / '__init__.py').read_text() == 'META = True\n'  # and the meta wheel's, in one install
    # a ready core that is not the one the Megatron set names (a later fetch replaced it) is refused
    sums = dest / '.whl' / 'megatron' / 'SHA256SUMS'
    original = sums.read_text()
    sums.write_text(original.replace(original.split()[0], '0' * 64, 1))
    proc = subprocess.run(['bash', SETUP_MEGATRON, 'assemble'], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and 'is not the one' in proc.stderr, proc.stderr
    sums.write_text(original)
    # an altered ready wheel is refused before anything is installed
    ready = dest / '.whl' / 'megatron-te' / CORE
    ready.write_bytes(ready.read_bytes() + b'\0')
    proc = subprocess.run(['bash', SETUP_MEGATRON, 'assemble'], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and 'refused' in proc.stderr and CORE in proc.stderr


def test_exclude_leaves_a_wheel_out(root, tmp_path):
    out = tmp_path / 'wheels.tar.xz'
    wheel_pack.pack(str(root), ['swift'], ['py_spy'], str(out))
    with tarfile.open(out, 'r:xz') as tar:
        names = tar.getnames()
    assert names[0] == wheel_pack.MANIFEST
    assert '.whl/swift/alpha-1.0-py3-none-any.whl' in names
    assert not [n for n in names if 'py_spy' in n]


def test_a_damaged_te_part_stops_pack_naming_the_part(root, tmp_path):
    part = root / '.te1' / f'{CORE}.part1'
    part.write_bytes(part.read_bytes()[:-3])
    with pytest.raises(wheel_pack.PackError, match=r'\.te1/.*sha256'):
        wheel_pack.pack(str(root), ['megatron'], [], str(tmp_path / 'w.tar.xz'))
    assert not (tmp_path / 'w.tar.xz').exists()
    assert wheel_pack.main(['pack', '--root', str(root), '--sets', 'megatron', '--out',
                            str(tmp_path / 'w.tar.xz')]) == 1


def test_a_missing_set_names_the_folder(root, tmp_path):
    with pytest.raises(wheel_pack.PackError, match=r'\.whl/moe: no such wheel set'):
        wheel_pack.pack(str(root), ['moe'], [], str(tmp_path / 'w.tar.xz'))


def forged(path, entries, manifest_members):
    """An archive with the given manifest and members, as someone other than pack would write it."""
    with lzma.open(path, 'wb') as xz, tarfile.open(fileobj=xz, mode='w') as tar:
        for name, data in [(wheel_pack.MANIFEST, json.dumps({'sets': ['swift'], 'members': manifest_members})
                            .encode())] + entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize('case', ['altered', 'not_in_manifest', 'climbs_out', 'missing', 'truncated'])
def test_unpack_writes_nothing_it_cannot_check(tmp_path, case):
    good = b'wheel bytes'
    digest = {'sha256': hashlib.sha256(good).hexdigest(), 'bytes': len(good)}
    name = '.whl/swift/a-1.0-py3-none-any.whl'
    members = {name: digest}
    entries = [(name, good)]
    if case == 'altered':
        entries = [(name, b'other bytes')]
    elif case == 'not_in_manifest':
        entries = [('.whl/swift/extra.whl', good)]
    elif case == 'climbs_out':
        name = '../outside.whl'
        members, entries = {name: digest}, [(name, good)]
    else:
        members = {**members, '.whl/swift/b-1.0-py3-none-any.whl': digest}
    archive = tmp_path / 'w.tar.xz'
    forged(archive, entries, members)
    if case == 'truncated':  # a carry cut short: nothing of it may be written
        archive.write_bytes(archive.read_bytes()[:-40])
    dest = tmp_path / 'machine'
    dest.mkdir()
    with pytest.raises(wheel_pack.PackError) as err:
        wheel_pack.unpack(str(archive), str(dest))
    assert str(archive) in str(err.value)
    assert not (tmp_path / 'outside.whl').exists()
    assert not list(dest.rglob('*.whl'))  # checked whole before anything is written
