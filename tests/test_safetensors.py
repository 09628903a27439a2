"""The safetensors format as the C++ core writes and reads it: round trips, interoperability with the
`safetensors` package in both directions, atomic writes, and clear errors for bad files."""
import json
import os
import struct

import numpy as np
import pytest

import treadle as tl
from treadle import _core

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _arrays(rng):
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(4),  # float64
        "idx": np.arange(-3, 4, dtype=np.int64),
        "i32": np.array([[1, -2], [3, 2**31 - 1]], dtype=np.int32),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float64),
    }


def _assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


def _header(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8:8 + n]), data


def test_round_trip_all_dtypes_and_shapes(tmp_path):
    arrays = _arrays(np.random.default_rng(0))
    path = tmp_path / "t.safetensors"
    tl.io.save_file(arrays, path, metadata={"note": "hello \"world\"\n", "ünïcode": "✓"})
    back, meta = tl.io.load_file(path, with_metadata=True)
    _assert_same(arrays, back)
    assert meta["note"] == "hello \"world\"\n" and meta["ünïcode"] == "✓"
    assert meta["treadle.version"] == _core.serialize_version()
    assert meta["treadle.checksum"].startswith("fnv1a64:") and len(meta["treadle.checksum"]) == 8 + 16


def test_layout_is_safetensors(tmp_path):
    path = tmp_path / "t.safetensors"
    arrays = {"a": np.ones((2, 3), np.float32), "b": np.arange(4, dtype=np.int64)}
    tl.io.save_file(arrays, path)
    n, header, data = _header(path)
    assert (8 + n) % 8 == 0  # tensor data 8-byte aligned, as the safetensors package writes it
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "I64", "shape": [4], "data_offsets": [24, 56]}
    assert len(data) == 8 + n + 56
    assert data[8 + n:8 + n + 24] == arrays["a"].astype("<f4").tobytes()


def test_bytes_and_file_agree(tmp_path):
    arrays = _arrays(np.random.default_rng(1))
    path = tmp_path / "t.safetensors"
    tl.io.save_file(arrays, path, metadata={"k": "v"})
    with open(path, "rb") as f:
        assert f.read() == _core.safetensors_bytes(arrays, {"k": "v"})


def test_safetensors_package_reads_ours(tmp_path):
    arrays = _arrays(np.random.default_rng(2))
    path = str(tmp_path / "t.safetensors")
    tl.io.save_file(arrays, path, metadata={"k": "v"})
    _assert_same(arrays, safetensors_numpy.load_file(path))
    from safetensors import safe_open
    with safe_open(path, "np") as f:
        assert f.metadata()["k"] == "v"


def test_we_read_safetensors_package_files(tmp_path):
    arrays = _arrays(np.random.default_rng(3))
    del arrays["scalar"]  # kept below: numpy 0-d arrays go through the package too
    arrays["s"] = np.array(3.0)
    path = str(tmp_path / "t.safetensors")
    safetensors_numpy.save_file(arrays, path, metadata={"from": "numpy"})
    back, meta = tl.io.load_file(path, with_metadata=True)
    _assert_same(arrays, back)
    assert meta == {"from": "numpy"}  # no treadle keys: read unverified, as a foreign file


def test_we_read_torch_safetensors_files(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    path = str(tmp_path / "torch.safetensors")
    st_torch.save_file(net.state_dict(), path)
    back = tl.io.load_file(path)
    for k, v in net.state_dict().items():
        assert back[k].dtype == np.float64 and np.array_equal(back[k], v.numpy())


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "t.safetensors"
    tl.io.save_file({"a": np.ones(3, np.float32)}, path)
    old = path.read_bytes()
    # A failure before the file is complete (a tensor that cannot be written) leaves the old file.
    with pytest.raises(TypeError):
        tl.io.save_file({"a": np.ones(3, np.float32), "h": np.ones(3, np.float16)}, path)
    assert path.read_bytes() == old
    tl.io.save_file({"a": np.zeros(3, np.float32)}, path)  # overwrite
    assert np.array_equal(tl.io.load_file(path)["a"], np.zeros(3, np.float32))
    assert sorted(os.listdir(tmp_path)) == ["t.safetensors"]


def test_write_failure_in_unwritable_directory_keeps_old_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    path = tmp_path / "t.safetensors"
    tl.io.save_file({"a": np.ones(3, np.float32)}, path)
    old = path.read_bytes()
    os.chmod(tmp_path, 0o500)
    try:
        with pytest.raises(PermissionError):
            tl.io.save_file({"a": np.zeros(3, np.float32)}, path)
    finally:
        os.chmod(tmp_path, 0o700)
    assert path.read_bytes() == old


def test_io_errors_are_oserrors(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_safetensors"):
        tl.io.load_file(tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError):
        tl.io.save_file({"a": np.ones(2)}, tmp_path / "no" / "such" / "dir.safetensors")
    with pytest.raises(ValueError, match="not a regular file"):
        tl.io.load_file(tmp_path)


def test_bad_arguments_when_writing(tmp_path):
    path = tmp_path / "t.safetensors"
    with pytest.raises(ValueError, match="reserved"):
        tl.io.save_file({"a": np.ones(2)}, path, metadata={"treadle.checksum": "x"})
    with pytest.raises(TypeError, match="strings"):
        tl.io.save_file({"a": np.ones(2)}, path, metadata={"k": 1})
    with pytest.raises(ValueError, match="empty name"):
        tl.io.save_file({"": np.ones(2)}, path)
    with pytest.raises(ValueError, match="__metadata__"):
        tl.io.save_file({"__metadata__": np.ones(2)}, path)
    with pytest.raises(TypeError, match="float16"):
        tl.io.save_file({"a": np.ones(2, np.float16)}, path)
    assert not path.exists()


# -- bad files: ValueError naming the problem ------------------------------------------------------

def _valid_bytes():
    return _core.safetensors_bytes({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2)})


def _foreign(header, payload=b""):
    """A file as another tool would write it (no treadle checksum)."""
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + payload


@pytest.mark.parametrize("data, match", [
    (b"", "too short"),
    (b"\x01\x00\x00", "too short"),
    (struct.pack("<Q", 50) + b"{}", "exceeds the 2 bytes"),
    (struct.pack("<Q", 200_000_000) + b"{}", "exceeds the limit"),
    (struct.pack("<Q", 2**64 - 1) + b"{}", "exceeds the limit"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 3) + b"{x}", "not valid JSON|expected a string key"),
    (struct.pack("<Q", 5) + b"{}  x", "unexpected data"),
    (_foreign({"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}, b"\0\0"), "F16 is not supported"),
    (_foreign({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 2]}}, b"\0\0"), "unknown dtype 'Q7'"),
    (_foreign({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8 bytes"),
    (_foreign({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 2), "exceed the 2-byte payload"),
    (_foreign({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 6), "cover 4 bytes"),
    (_foreign({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "starts at byte 4"),
    (_foreign({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
               "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "tile"),
    (_foreign({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "non-negative"),
    (_foreign({"a": {"dtype": "F32", "shape": [2**31, 2**31, 2**31], "data_offsets": [0, 4]}}, b"\0" * 4),
     "more elements"),
    (_foreign({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}, b"\0" * 4), "exactly"),
    (_foreign({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4), "begin <= end"),
    (_foreign({"__metadata__": {"k": 1}}), "not a string"),
    (_foreign({"__metadata__": {"treadle.version": "0.1.0"}}), "has no treadle.checksum"),
    (struct.pack("<Q", 13) + b'{"a":1,"a":2}', "duplicate key"),
    (struct.pack("<Q", 7) + b'{"\xff":1}', "invalid UTF-8"),
    (struct.pack("<Q", 400) + b"[" * 200 + b"]" * 200, "nesting deeper"),
])
def test_bad_files_raise_value_error(data, match):
    with pytest.raises(ValueError, match=match):
        _core.parse_safetensors(data)


def test_checksum_detects_payload_and_header_changes():
    data = bytearray(_valid_bytes())
    data[-1] ^= 0x10
    with pytest.raises(ValueError, match="checksum mismatch"):
        _core.parse_safetensors(bytes(data))
    data = bytearray(_valid_bytes())
    i = data.index(b'"shape":[2,3]')
    data[i:i + 13] = b'"shape":[3,2]'  # same size, different meaning: caught by the checksum
    with pytest.raises(ValueError, match="checksum mismatch"):
        _core.parse_safetensors(bytes(data))


def test_every_truncation_is_an_error(tmp_path):
    data = _valid_bytes()
    for n in range(len(data)):
        with pytest.raises(ValueError):
            _core.parse_safetensors(data[:n])
    path = tmp_path / "t.safetensors"
    path.write_bytes(data[:-3])
    with pytest.raises(ValueError, match="truncated"):
        tl.io.load_file(path)


def test_metadata_only_read(tmp_path):
    path = tmp_path / "t.safetensors"
    tl.io.save_file({"a": np.ones(3)}, path, metadata={"k": "v"})
    assert tl.io.read_metadata(path)["k"] == "v"


def test_failed_rename_removes_the_temporary_file(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")  # a non-empty directory cannot be replaced by a file
    with pytest.raises(OSError):
        tl.io.save_file({"a": np.ones(3)}, target)
    assert sorted(os.listdir(tmp_path)) == ["target"]
    assert os.listdir(target) == ["keep"]
