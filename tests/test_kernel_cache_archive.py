"""`swift-vora kernel-cache export|import` (swift_vora/backends/kernel_cache_archive.py): a fresh machine gets the
compiled kernels and autotuning results of another, so that its first step does not recompile for minutes. What a
user relies on: every Triton and inductor entry arrives byte for byte in this machine's folders; Triton's group
files point at this machine's folder; nothing already there is overwritten; a missing part or a foreign member is
refused naming the file; parts reassemble. Small files stand in for compiled kernels."""
import json
import os

import pytest

from swift_vora.backends import kernel_cache_archive as archive
from swift_vora.cli import main
from swift_vora.errors import CliError


def machine(tmp_path, name):
    """The cache variables of a machine whose swift-vora cache root is tmp_path/name."""
    return {'SWIFT_VORA_CACHE_DIR': str(tmp_path / name)}


def fill(root):
    """A Triton cache as Triton 3.x writes it (a kernel's files plus a group file naming them by absolute path), an
    inductor entry, and an Unsloth module (which must not travel)."""
    triton = root / 'triton' / 'ABC123'
    triton.mkdir(parents=True)
    (triton / 'chunk_fwd.cubin').write_bytes(os.urandom(4096))
    (triton / 'chunk_fwd.json').write_text('{"name": "chunk_fwd"}')
    group = {'child_paths': {'chunk_fwd.cubin': str(triton / 'chunk_fwd.cubin'),
                             'chunk_fwd.json': str(triton / 'chunk_fwd.json')}}
    (triton / '__grp__chunk_fwd.json').write_text(json.dumps(group))
    (root / 'inductor' / 'fxgraph' / 'xy').mkdir(parents=True)
    (root / 'inductor' / 'fxgraph' / 'xy' / 'entry').write_bytes(b'graph')
    (root / 'unsloth_compiled').mkdir()
    (root / 'unsloth_compiled' / 'unsloth_module.py').write_text('# generated at import\n')


def versions(**kw):
    base = {'torch': '2.11.0', 'triton': '3.6.0', 'cuda': '13.0', 'capability': [9, 0]}
    return lambda: {**base, **kw}


def test_a_fresh_machine_gets_every_entry_and_group_files_point_at_its_folder(tmp_path):
    fill(tmp_path / 'a')
    out = tmp_path / 'carry' / 'kernel-cache.tar.xz'
    r = archive.export(str(out), environ=machine(tmp_path, 'a'), versions=versions())
    assert r['entries'] == {'TRITON_CACHE_DIR': 3, 'TORCHINDUCTOR_CACHE_DIR': 1}
    got = archive.import_(str(out), environ=machine(tmp_path, 'b'), versions=versions())
    assert got['written'] == 4 and got['kept'] == 0 and got['differs'] == {}
    a, b = tmp_path / 'a', tmp_path / 'b'
    cubin = 'triton/ABC123/chunk_fwd.cubin'
    assert (b / cubin).read_bytes() == (a / cubin).read_bytes()
    assert (b / 'inductor/fxgraph/xy/entry').read_bytes() == b'graph'
    assert not (b / 'unsloth_compiled').exists()  # Unsloth regenerates its modules for what is installed
    group = json.loads((b / 'triton/ABC123/__grp__chunk_fwd.json').read_text())
    assert set(group['child_paths'].values()) == {str(b / cubin), str(b / 'triton/ABC123/chunk_fwd.json')}
    assert all(os.path.isfile(p) for p in group['child_paths'].values())  # what Triton's get_group checks


def test_parts_reassemble_and_a_missing_part_is_refused(tmp_path):
    fill(tmp_path / 'a')
    (tmp_path / 'a' / 'triton' / 'ABC123' / 'big.cubin').write_bytes(os.urandom(300_000))  # incompressible
    out = tmp_path / 'carry' / 'kernel-cache.tar.xz'
    r = archive.export(str(out), part_mib=0.1, environ=machine(tmp_path, 'a'), versions=versions())
    assert len(r['files']) >= 3 and not out.exists()
    assert all(os.path.getsize(f) <= 0.1 * 2 ** 20 for f in r['files'])
    got = archive.import_(r['files'][0], environ=machine(tmp_path, 'b'), versions=versions())
    assert got['written'] == 5
    big = 'triton/ABC123/big.cubin'
    assert (tmp_path / 'b' / big).read_bytes() == (tmp_path / 'a' / big).read_bytes()
    os.remove(r['files'][-1])  # the last part did not arrive
    with pytest.raises(CliError, match='not a complete kernel-cache archive'):
        archive.import_(str(out), environ=machine(tmp_path, 'c'), versions=versions())
    assert not (tmp_path / 'c').exists()


def test_entries_already_there_are_kept_and_other_versions_are_named(tmp_path):
    fill(tmp_path / 'a')
    out = tmp_path / 'kc.tar.xz'
    archive.export(str(out), environ=machine(tmp_path, 'a'), versions=versions())
    mine = tmp_path / 'b' / 'triton' / 'ABC123' / 'chunk_fwd.json'
    mine.parent.mkdir(parents=True)
    mine.write_text('{"name": "mine"}')
    got = archive.import_(str(out), environ=machine(tmp_path, 'b'), versions=versions(triton='3.7.0'))
    assert got['kept'] == 1 and got['written'] == 3
    assert mine.read_text() == '{"name": "mine"}'
    assert got['differs'] == {'triton': {'archive': '3.6.0', 'here': '3.7.0'}}
    assert 'triton 3.6.0 (here 3.7.0)' in archive.describe_import(got)


def test_export_of_empty_caches_says_so(tmp_path):
    with pytest.raises(CliError, match='caches are empty'):
        archive.export(str(tmp_path / 'kc.tar.xz'), environ=machine(tmp_path, 'empty'), versions=versions())


def test_a_member_outside_the_caches_is_refused(tmp_path):
    import io
    import lzma
    import tarfile
    path = tmp_path / 'forged.tar.xz'
    with lzma.open(path, 'wb') as xz, tarfile.open(fileobj=xz, mode='w') as tar:
        for name, data in ((archive.INFO, json.dumps({'folders': {}, 'made_on': {}}).encode()),
                           ('TRITON_CACHE_DIR/../../escape', b'x')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(CliError, match=r'forged\.tar\.xz.*leaves its cache folder'):
        archive.import_(str(path), environ=machine(tmp_path, 'b'), versions=versions())
    assert not (tmp_path / 'escape').exists()


def test_the_command_line_round_trip(tmp_path, monkeypatch, capsys):
    fill(tmp_path / 'a')
    monkeypatch.setenv('SWIFT_VORA_CACHE_DIR', str(tmp_path / 'a'))
    for var in ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR'):
        monkeypatch.delenv(var, raising=False)
    assert main(['kernel-cache', 'export', str(tmp_path / 'kc.tar.xz'), '--json']) == 0
    assert json.loads(capsys.readouterr().out)['entries']['TRITON_CACHE_DIR'] == 3
    monkeypatch.setenv('SWIFT_VORA_CACHE_DIR', str(tmp_path / 'b'))
    assert main(['kernel-cache', 'import', str(tmp_path / 'kc.tar.xz')]) == 0
    assert 'kernel cache imported: 4 files written' in capsys.readouterr().out
    assert main(['kernel-cache', 'import', str(tmp_path / 'missing.tar.xz')]) == 2  # no such path: a usage error
    assert 'missing.tar.xz: no such file' in capsys.readouterr().err


def test_group_files_point_at_the_new_folder_whatever_the_old_one_was_spelt(tmp_path):
    """A cache folder given with a trailing slash on the exporting machine: the group file's members still resolve."""
    fill(tmp_path / 'a')
    out = tmp_path / 'kc.tar.xz'
    archive.export(str(out), environ={'TRITON_CACHE_DIR': str(tmp_path / 'a' / 'triton') + '/',
                                      'TORCHINDUCTOR_CACHE_DIR': str(tmp_path / 'a' / 'inductor')},
                   versions=versions())
    archive.import_(str(out), environ=machine(tmp_path, 'b'), versions=versions())
    group = json.loads((tmp_path / 'b/triton/ABC123/__grp__chunk_fwd.json').read_text())
    assert all(os.path.isfile(p) for p in group['child_paths'].values()), group


def test_a_later_export_replaces_an_earlier_one_whole_or_in_parts(tmp_path):
    fill(tmp_path / 'a')
    out = tmp_path / 'kc.tar.xz'
    archive.export(str(out), environ=machine(tmp_path, 'a'), versions=versions())  # whole
    (tmp_path / 'a' / 'triton' / 'ABC123' / 'new.cubin').write_bytes(b'new kernel')
    r = archive.export(str(out), part_mib=1, environ=machine(tmp_path, 'a'), versions=versions())  # in parts
    assert not out.exists() and r['files'] == [f'{out}.part0']
    got = archive.import_(str(out), environ=machine(tmp_path, 'b'), versions=versions())
    assert got['written'] == 5 and (tmp_path / 'b/triton/ABC123/new.cubin').read_bytes() == b'new kernel'
    named = tmp_path / 'my.partial.tar.xz'  # '.part' inside a name is not a part suffix
    archive.export(str(named), environ=machine(tmp_path, 'a'), versions=versions())
    assert archive.import_(str(named), environ=machine(tmp_path, 'c'), versions=versions())['written'] == 5


def test_a_foreign_info_file_is_refused_naming_the_archive(tmp_path):
    import io
    import lzma
    import tarfile
    path = tmp_path / 'odd.tar.xz'
    with lzma.open(path, 'wb') as xz, tarfile.open(fileobj=xz, mode='w') as tar:
        data = b'not json'
        info = tarfile.TarInfo(archive.INFO)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(CliError, match=r'odd\.tar\.xz: kernel-cache\.json is not what export writes'):
        archive.import_(str(path), environ=machine(tmp_path, 'b'), versions=versions())
