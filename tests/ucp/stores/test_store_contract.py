"""The store contract: every store (local disk, local through tensorstore, fsspec, memory, S3 on a local
S3 server) passes the same tests of bytes, arrays, errors and its commit strategy."""

from __future__ import annotations

import json

import threading
import uuid

import numpy as np
import pytest

from ucp import checksum
from ucp.errors import CheckpointExistsError, IncompleteCheckpointError, TruncatedDataError, UnsafePathError
from ucp.stores import FsspecStore, LocalStore, MemoryStore, S3Store, Store, StoreOptions, open_store
from ucp.zarr_array import chunk_key

TENSORSTORE = StoreOptions(direct_writes=False, direct_reads=False, small_array_bytes=-1)
# name -> (makes a root URL, store options, atomic exclusive commit?)
STORES = ["local", "local-tensorstore", "fsspec", "memory", "s3"]


# The stores replica tiers keep their blobs in (ucp.replication.replica_tiers): they use plain bytes only.
TIER_STORES = ["memory-tier", "disk-tier"]


@pytest.fixture(params=STORES)
def make(request, tmp_path):
    """``make(name)`` opens a store at a fresh root of the kind under test (same kind for every name)."""
    return _maker(request, tmp_path)


@pytest.fixture(params=STORES + TIER_STORES)
def make_plain(request, tmp_path):
    """As ``make``, also over the stores of replica tiers (for the tests of plain bytes)."""
    return _maker(request, tmp_path)


def _maker(request, tmp_path):
    from ucp.replication.replica_tiers import DiskTier, MemoryTier

    kind = request.param
    prefix = uuid.uuid4().hex[:8]
    if kind == "memory-tier":
        return lambda name="c", **kw: MemoryTier(capacity_bytes=1 << 20).store
    if kind == "disk-tier":
        return lambda name="c", **kw: DiskTier(tmp_path / "tiers" / name, capacity_bytes=1 << 20).store
    if kind == "s3":
        bucket, storage_options = request.getfixturevalue("s3")
        return lambda name="c", **kw: open_store(f"{bucket}/{prefix}/{name}", storage_options=storage_options, **kw)
    if kind == "fsspec":  # the generic store, over fsspec's memory filesystem
        return lambda name="c", **kw: FsspecStore(f"memory://contract-{prefix}/{name}", **kw)
    if kind == "memory":
        return lambda name="c", **kw: open_store(f"memory://contract-{prefix}/{name}", **kw)
    options = TENSORSTORE if kind == "local-tensorstore" else None
    return lambda name="c", **kw: open_store(str(tmp_path / name), **{"options": options, **kw})


def test_open_store_picks_the_store_for_the_url(tmp_path, s3):
    bucket, storage_options = s3
    assert type(open_store(tmp_path)) is LocalStore
    assert type(open_store(f"file://{tmp_path}")) is LocalStore
    assert type(open_store("memory://x")) is MemoryStore
    assert type(open_store(f"{bucket}/x", storage_options=storage_options)) is S3Store
    for store in (open_store(tmp_path), open_store("memory://x")):
        assert isinstance(store, Store)


def test_plain_bytes(make_plain):
    store = make_plain()
    assert store.kind() is None and not store.exists() and store.listdir() == []
    store.write_bytes("a/one.json", b"{}")
    store.write_bytes("a/two.json", b"0123456789")
    store.write_bytes("a/two.json", b"abcdefghij")  # replaced whole
    assert store.kind() == "directory" and store.exists("a", "one.json")
    assert store.listdir() == ["a"] and store.listdir("a") == ["one.json", "two.json"]
    assert store.read_bytes("a", "two.json") == b"abcdefghij"
    assert store.read_range("a/two.json", 3, 4)[0] == b"defg"
    assert store.read_range("a/two.json", 8, 10)[0] == b"ij"  # fewer at the end
    assert store.file_size("a/two.json") == 10
    assert store.read_file("a/two.json", limit=10, allowed="a test allows") == b"abcdefghij"
    with pytest.raises(UnsafePathError, match="a test allows; refusing to read it"):
        store.read_file("a/two.json", limit=9, allowed="a test allows")
    store.remove("a", "one.json")
    assert store.listdir("a") == ["two.json"]
    store.remove()
    assert not store.exists() and store.kind() is None
    store.remove()  # removing nothing is fine


@pytest.mark.parametrize("rel", ["../out.json", "/out.json", "a/../../out.json", "a/./b.json", "a/"])
def test_writes_stay_inside_the_root(make_plain, rel):
    store, beside = make_plain("c"), make_plain("out.json")
    with pytest.raises(UnsafePathError, match=r"^'.*' is not a relative path of plain names inside the checkpoint .*; "
                                              "refusing to write it$"):
        store.write_bytes(rel, b"{}")
    assert not beside.exists() and not store.exists("a")


def test_reads_stay_inside_the_root(make_plain):
    store, beside = make_plain("c"), make_plain("c2")
    beside.write_bytes("x.json", b"secret")
    store.write_bytes("a/b.json", b"{}")
    for rel in ("../c2/x.json", "/" + beside.path("x.json").lstrip("/"), "a/../../c2/x.json"):
        for read in (lambda: store.read_file(rel, limit=99, allowed="a test allows"),
                     lambda: store.read_range(rel, 0, 99), lambda: store.file_size(rel)):
            with pytest.raises(UnsafePathError):
                read()


@pytest.mark.parametrize("shape, rows", [((10, 3), 4), ((7,), 7), ((), 1), ((5, 2, 3), 2)])
def test_arrays_round_trip_chunk_by_chunk(make, shape, rows):
    store = make()
    array = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 1.5
    futures = store.write_array("data/r0/a", array, dtype="float32", chunk_rows=rows, attributes={"ucp": {}},
                                hasher=checksum.hasher)
    digests = [f.result() for f in futures]
    count = 1 if not shape else -(-shape[0] // rows)
    pieces = [array] if not shape else [array[i * rows : (i + 1) * rows] for i in range(count)]
    assert digests == [checksum.digest(np.ascontiguousarray(p)) for p in pieces]
    store.sync()
    for index, piece in enumerate(pieces):
        got = store.read_chunk("data/r0/a", shape, "float32", index, rows, what="tensor 'a'").result()
        np.testing.assert_array_equal(got, piece)
        out = np.empty_like(piece)
        found = store.read_chunk_into("data/r0/a", shape, "float32", index, rows, out, what="tensor 'a'",
                                      digest=checksum.digest).result()
        np.testing.assert_array_equal(out, piece)
        assert found == digests[index]
    store.close()


def test_small_arrays_and_packs(make):
    store = make()
    small = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert [f.result() for f in store.write_array("data/r0/s", small, dtype="int16", chunk_rows=2, attributes={})] \
        == [None]
    np.testing.assert_array_equal(store.read_small("data/r0/s", (2, 3), "int16", what="tensor 's'"), small)
    a, b = np.arange(5, dtype=np.float32), np.array([1, 2, 3], dtype=np.int16)
    digests = store.write_pack("data/r0/pack", [a, b], align=64, hasher=checksum.hasher).result()
    assert digests == [checksum.digest(a), checksum.digest(b)]
    raw = store.read_range("data/r0/pack/c.0", 0, 1 << 10)[0]
    assert raw == a.tobytes() + bytes(44) + b.tobytes() + bytes(58)  # each at a multiple of 64, zero-filled
    np.testing.assert_array_equal(store.read_packed("data/r0/pack", 64, (3,), "int16", what="b", extent=70), b)
    np.testing.assert_array_equal(store.read_packed("data/r0/pack", 0, (5,), "float32", what="a", extent=70), a)


def test_missing_and_truncated_chunks_are_named(make):
    store = make()
    array = np.ones((8, 2), dtype=np.float64)
    for f in store.write_array("data/r0/a", array, dtype="float64", chunk_rows=4, attributes={}):
        f.result()
    store.remove("data/r0/a/" + chunk_key((8, 2), 1))
    with pytest.raises(IncompleteCheckpointError) as err:
        store.read_chunk("data/r0/a", (8, 2), "float64", 1, 4, what="tensor 'a'").result()
    assert str(err.value).startswith("tensor 'a': ") and "is missing; the checkpoint is incomplete" in str(err.value)
    store.close()  # forget opened arrays: the next read sees the damage
    store.write_bytes("data/r0/a/" + chunk_key((8, 2), 0), bytes(40))  # 64 expected
    with pytest.raises(TruncatedDataError) as err:
        store.read_chunk("data/r0/a", (8, 2), "float64", 0, 4, what="tensor 'a'").result()
    assert str(err.value).startswith("tensor 'a': ") and "shorter or longer than the manifest says" in str(err.value)
    store.write_bytes("data/r0/s/c.0", bytes(3))
    with pytest.raises(TruncatedDataError, match=r"^tensor 's': .* is shorter or longer than the manifest says "
                                                 r"\(3 bytes, expected 8\)"):
        store.read_small("data/r0/s", (2,), "float32", what="tensor 's'")
    with pytest.raises(IncompleteCheckpointError, match="^tensor 'n': .* is missing"):
        store.read_small("data/r0/none", (2,), "float32", what="tensor 'n'")


def _save(store: Store, token: str, payload: bytes) -> tuple[Store, str]:
    staged, prefix = store.staging(token)
    store.prepare_staging(staged, shared=False, overwrite=False)
    staged.write_bytes(f"data/{prefix}r0/x", payload)
    return staged, prefix


def _manifest(prefix: str, m: int) -> bytes:
    """A manifest naming the array ``data/<prefix>r0/x`` (an overwrite removes what the replaced one names)."""
    return json.dumps({"m": m, "format_version": 1,
                       "tensors": {"x": {"fragments": [{"key": f"{prefix}r0/x"}]}}}).encode()


def test_commit_makes_the_checkpoint_exist_and_never_replaces_unasked(make):
    final = make("ckpt")
    staged, prefix = _save(final, "one", b"first")
    assert not final.exists("manifest.json")
    final.commit(staged, _manifest(prefix, 1), overwrite=False, key_prefix=prefix)
    assert final.read_bytes("manifest.json") == _manifest(prefix, 1)
    assert final.read_bytes("data", f"{prefix}r0", "x") == b"first"
    staged, prefix2 = _save(final, "two", b"second")
    with pytest.raises(CheckpointExistsError) as err:
        final.commit(staged, b'{"m": 2}', overwrite=False, key_prefix=prefix2)
    assert str(err.value) == (f"a checkpoint already exists at {final.display()}; pass overwrite=True to replace it "
                              "or save to a new path")
    assert final.read_bytes("manifest.json") == _manifest(prefix, 1)
    final.discard(staged, prefix2)
    staged, prefix3 = _save(final, "three", b"third")
    pending, prefix4 = _save(final, "four", b"fourth")  # another overwrite, still writing
    final.commit(staged, _manifest(prefix3, 3), overwrite=True, key_prefix=prefix3)
    assert final.read_bytes("manifest.json") == _manifest(prefix3, 3)
    assert final.read_bytes("data", f"{prefix3}r0", "x") == b"third"
    assert pending.read_bytes("data", f"{prefix4}r0", "x") == b"fourth"  # not the replaced checkpoint's
    final.discard(pending, prefix4)
    assert final.listdir("data") == [f"{prefix3}r0" if not prefix3 else prefix3.rstrip("/")]  # the old arrays went
    pending, prefix5 = _save(final, "five", b"fifth")  # a save to the same path, still writing
    final.delete()
    assert not final.exists("manifest.json")
    assert pending.read_bytes("data", f"{prefix5}r0", "x") == b"fifth"  # only the deleted checkpoint's arrays went
    final.discard(pending, prefix5)
    assert not final.exists("manifest.json") and final.unfinished_save() is None


def test_a_save_that_never_committed_is_reported(make):
    final = make("ckpt")
    staged, prefix = _save(final, "dead", b"x")
    assert "has no committed manifest.json: a save was started but never committed" in final.unfinished_save()
    final.discard(staged, prefix)
    final.sweep(child=lambda name: True, skip=set())


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])  # stores whose commit is atomic (not the generic one)
def test_racing_commits_one_wins(kind, tmp_path, request):
    if kind == "s3":
        bucket, storage_options = request.getfixturevalue("s3")
        final = open_store(f"{bucket}/race/ckpt", storage_options=storage_options)
    elif kind == "memory":
        final = open_store(f"memory://race-{uuid.uuid4().hex[:8]}/ckpt")
    else:
        final = open_store(tmp_path / "ckpt")
    saves = [_save(final, f"t{i}", b"%d" % i) for i in range(4)]
    won, lost = [], []
    barrier = threading.Barrier(len(saves))

    def commit(i: int) -> None:
        staged, prefix = saves[i]
        barrier.wait()
        try:
            final.commit(staged, b"%d" % i, overwrite=False, key_prefix=prefix)
            won.append(i)
        except CheckpointExistsError:
            lost.append(i)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(saves))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == len(saves) - 1
    assert final.read_bytes("manifest.json") == b"%d" % won[0]


def test_options_are_checked_and_round_trip():
    options = StoreOptions(chunk_bytes=64, direct_reads=False)
    assert StoreOptions.parse(str(options)) == options == StoreOptions.from_dict(options.to_dict())
    with pytest.raises(ValueError, match=r"^StoreOptions.chunk_bytes must be an integer >= 1, got 0$"):
        StoreOptions(chunk_bytes=0)
    with pytest.raises(ValueError, match=r"^unknown store option\(s\) chunks; known: "):
        StoreOptions.from_dict({"chunks": 1})
    with pytest.raises(TypeError):
        StoreOptions(64)  # keyword-only
