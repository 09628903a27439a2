"""Fuzzing the C++ safetensors loader: random bytes, random headers, truncations and bit flips of valid
files. Every input must either load consistently or raise ValueError; nothing may crash, hang or
read out of bounds (run under ASan/valgrind to check the last part), and a model is never changed by
a file that fails."""
import json
import struct

import numpy as np
import pytest

import treadle as tl
from treadle import _core

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)


def _valid():
    rng = np.random.default_rng(0)
    return _core.safetensors_bytes({"0.weight": rng.standard_normal((3, 2)).astype(np.float32),
                                    "0.bias": rng.standard_normal(3).astype(np.float32),
                                    "steps": np.arange(2, dtype=np.int64), "empty": np.zeros((0, 4))},
                                   {"note": "fuzz"})


VALID = _valid()


def _parse_or_value_error(data):
    """Returns the parsed file, or None after a ValueError; any other outcome fails the test."""
    try:
        tensors, meta = _core.parse_safetensors(bytes(data))
    except ValueError as e:
        assert str(e).startswith("parse_safetensors("), str(e)
        return None
    # Whatever loads is self-consistent: it must fit in the bytes given.
    assert sum(a.nbytes for a in tensors.values()) <= len(data)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    return tensors, meta


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes(data):
    _parse_or_value_error(data)


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 2**64 - 1))
def test_random_bytes_after_a_length(body, declared):
    _parse_or_value_error(struct.pack("<Q", declared) + body)
    _parse_or_value_error(struct.pack("<Q", min(len(body), declared)) + body)


_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                          st.text(max_size=8))
_json = st.recursive(_json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)
_dims = st.lists(st.one_of(st.integers(0, 6), st.integers(-3, 2**64 + 3)), max_size=4)
_entry = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F64", "I32", "I64", "F16", "BF16", "BOOL", "U8", "x"]),
    "shape": _dims,
    "data_offsets": st.lists(st.integers(-2, 200), min_size=0, max_size=3),
})


@FUZZ
@given(st.dictionaries(st.text(min_size=0, max_size=5), st.one_of(_entry, _json), max_size=5),
       st.integers(0, 160), st.booleans())
def test_random_headers(header, payload_size, pad):
    text = json.dumps(header).encode() + (b"   " if pad else b"")
    data = struct.pack("<Q", len(text)) + text + bytes(range(256))[:payload_size]
    result = _parse_or_value_error(data)
    if result is not None:  # accepted: the tensors tile the payload exactly
        tensors, _ = result
        assert sum(a.nbytes for a in tensors.values()) == len(data) - 8 - len(text)


@FUZZ
@given(st.integers(0, len(VALID) - 1))
def test_truncations_are_errors(n):
    assert _parse_or_value_error(VALID[:n]) is None


@FUZZ
@given(st.lists(st.integers(0, len(VALID) * 8 - 1), min_size=1, max_size=8))
def test_bit_flips_are_errors(bits):
    """Up to 8 flipped bits anywhere are always detected: even flips aimed at hiding that treadle
    wrote the file (renaming its "treadle." keys, damaging the checksum's prefix) need 9 or more."""
    data = bytearray(VALID)
    for b in bits:
        data[b // 8] ^= 1 << (b % 8)
    if bytes(data) != VALID:  # flips that cancel out leave the valid file
        assert _parse_or_value_error(data) is None


def test_targeted_flips_that_hide_treadle_marks_are_detected():
    """The worst case for 2 flips per mark: every "treadle." key and the "fnv1a64:" value damaged."""
    data = bytearray(VALID)
    for mark in (b'"treadle.', b'"fnv1a64:'):
        start = 0
        while (i := data.find(mark, start)) >= 0:
            data[i + 1] ^= 0x01
            data[i + 2] ^= 0x01
            start = i + 1
    data[-1] ^= 0x80  # and the payload
    with pytest.raises(ValueError, match="has no treadle.checksum"):
        _core.parse_safetensors(bytes(data))


@FUZZ
@given(st.integers(0, len(VALID) - 1), st.binary(min_size=1, max_size=16))
def test_overwritten_bytes_are_errors(pos, junk):
    data = bytearray(VALID)
    data[pos:pos + len(junk)] = junk
    data = bytes(data[:len(VALID)])
    if data != VALID:
        assert _parse_or_value_error(data) is None


def test_every_single_bit_flip_and_truncation():
    """Exhaustive on a small file: each of its bits flipped, and each of its prefixes."""
    for bit in range(len(VALID) * 8):
        data = bytearray(VALID)
        data[bit // 8] ^= 1 << (bit % 8)
        assert _parse_or_value_error(data) is None, bit
    for n in range(len(VALID)):
        assert _parse_or_value_error(VALID[:n]) is None, n
    assert _parse_or_value_error(VALID) is not None


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(3, 4), tl.nn.Tanh(), tl.nn.Linear(4, 2))
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    tl.save(net, path)
    return path, path.read_bytes()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_corrupt_model_files_leave_the_model_unchanged(model_file, data):
    path, good = model_file
    kind = data.draw(st.sampled_from(["flip", "truncate", "junk"]))
    bad = bytearray(good)
    if kind == "flip":
        for b in data.draw(st.lists(st.integers(0, len(good) * 8 - 1), min_size=1, max_size=3)):
            bad[b // 8] ^= 1 << (b % 8)
    elif kind == "truncate":
        bad = bad[:data.draw(st.integers(0, len(good) - 1))]
    else:
        pos = data.draw(st.integers(0, len(good) - 1))
        bad[pos:pos + 4] = data.draw(st.binary(min_size=1, max_size=4))
    if bytes(bad) == good:
        return
    target = path.with_name("bad.safetensors")
    target.write_bytes(bytes(bad))
    tl.manual_seed(1)
    net = tl.nn.Sequential(tl.nn.Linear(3, 4), tl.nn.Tanh(), tl.nn.Linear(4, 2))
    before = net.flat_parameters().copy()
    with pytest.raises(ValueError):
        tl.load(target, model=net)
    with pytest.raises(ValueError):
        tl.load(target)
    assert np.array_equal(net.flat_parameters(), before)
