"""Model files are untrusted input: a checksum is not a signature (anyone can forge one), so what a
file declares is checked against what it holds before anything is allocated for it.

The forged files here are written by the core's own writer, which computes a valid checksum: what
anyone can do with a few lines of code (tests/test_checkpoint.py recomputes one by hand)."""
import json
import os
import resource
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import treadle as tl

FORMAT = "treadle-architecture/1"


def _forge(path, layers, tensors=None, dtype="float32"):
    """A file that tl.load accepts as far as its checksum goes, declaring `layers` over `tensors`."""
    arch = json.dumps({"format": FORMAT, "model": {"type": "Sequential", "layers": layers}})
    meta = {"treadle.architecture": arch, "treadle.dtype": dtype, "treadle.kind": "model"}
    tl._core.save_safetensors(str(path), dict(tensors or {}), meta)
    return path


ABSURD = {
    "Linear": {"type": "Linear", "config": {"in_features": 1, "out_features": 2 ** 62}},
    "Embedding": {"type": "Embedding", "config": {"num_embeddings": 2 ** 62, "embedding_dim": 4}},
    "LayerNorm": {"type": "LayerNorm", "config": {"normalized_shape": [2 ** 31, 2 ** 31]}},
    "GroupNorm": {"type": "GroupNorm", "config": {"num_groups": 1, "num_channels": 2 ** 62}},
    "BatchNorm1d": {"type": "BatchNorm1d", "config": {"num_features": 2 ** 62}},
    "Conv2d": {"type": "Conv2d", "config": {"in_channels": 2 ** 40, "out_channels": 2 ** 40, "kernel_size": 3}},
}
# Sizes a machine could allocate but no honest file of a few hundred bytes describes.
COSTLY = {
    "Linear": {"type": "Linear", "config": {"in_features": 16000, "out_features": 16000}},
    "Embedding": {"type": "Embedding", "config": {"num_embeddings": 4_000_000, "embedding_dim": 64}},
    "Conv2d": {"type": "Conv2d", "config": {"in_channels": 512, "out_channels": 512, "kernel_size": 22}},
}

_LOAD_IN_A_CHILD = textwrap.dedent("""
    import resource, sys, time
    import treadle as tl
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        tl.load(sys.argv[1])
    except ValueError as e:
        print("refused:", e)
    else:
        print("accepted")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(f"grew {grown} KiB in {time.perf_counter() - start:.3f} s")
""")


def _load_in_a_child(path):
    proc = subprocess.run([sys.executable, "-c", _LOAD_IN_A_CHILD, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-3000:]}"
    grown_kib = int(proc.stdout.split("grew ")[1].split()[0])
    return proc.stdout, grown_kib


@pytest.mark.parametrize("layer", sorted(ABSURD))
def test_an_absurd_architecture_over_an_empty_payload_is_refused(tmp_path, layer):
    out, _ = _load_in_a_child(_forge(tmp_path / "forged.safetensors", [ABSURD[layer]]))
    assert "refused:" in out, out


@pytest.mark.parametrize("layer", sorted(COSTLY))
def test_a_costly_architecture_is_refused_before_it_is_allocated(tmp_path, layer):
    """A 400-byte file declaring a ~1 GB layer used to cost that memory and seconds of initialisation."""
    path = _forge(tmp_path / "forged.safetensors", [COSTLY[layer]])
    assert os.path.getsize(path) < 1000
    out, grown_kib = _load_in_a_child(path)
    assert "refused:" in out and "does not describe them" in out, out
    assert grown_kib < 64 * 1024, out  # the layer's memory (~1 GB) was never taken


def test_honest_files_still_load_at_both_dtypes(tmp_path):
    for dtype in ("float32", "float64"):
        tl.manual_seed(0)
        net = tl.nn.Sequential(tl.nn.Linear(300, 400), tl.nn.LayerNorm(400), tl.nn.Tanh(), tl.nn.Linear(400, 2))
        net.to(dtype)
        path = tmp_path / f"net_{dtype}.safetensors"
        tl.save(net, path)
        again = tl.load(path)
        assert again.dtype == dtype
        x = np.linspace(-1, 1, 600).reshape(2, 300).astype(dtype)
        np.testing.assert_array_equal(again.predict(x), net.predict(x))


def test_the_architecture_must_match_the_tensors_even_when_small(tmp_path):
    """Within the budget, the usual check still names what differs."""
    path = _forge(tmp_path / "small.safetensors", [{"type": "Linear", "config": {"in_features": 3, "out_features": 2}}],
                  {"0.weight": np.ones((2, 3), np.float32)})
    with pytest.raises(ValueError, match="0.bias"):
        tl.load(path)


def test_header_parsing_is_linear_in_the_number_of_keys(tmp_path):
    """Duplicate keys used to be found by scanning every earlier key: a 2.5 MB header took 94 s."""
    def header_with(n):
        meta = {f"k{i:07d}": "v" for i in range(n)}
        path = tmp_path / f"meta_{n}.safetensors"
        tl.io.save_file({}, str(path), metadata=meta)
        start = time.perf_counter()
        assert len(tl.io.read_metadata(str(path))) == n + 2  # + checksum and version
        return time.perf_counter() - start

    small, large = header_with(10_000), header_with(160_000)
    # 16x the keys: linear takes ~16x (quadratic would be 256x); generous for a shared machine.
    assert large < 64 * small + 0.5, (small, large)


def test_a_wide_file_of_many_tensors_loads_in_linear_time(tmp_path):
    tensors = {f"t{i:06d}": np.zeros(1, np.float32) for i in range(20_000)}
    path = tmp_path / "wide.safetensors"
    tl.io.save_file(tensors, str(path))
    start = time.perf_counter()
    assert len(tl.io.load_file(str(path))) == 20_000
    assert time.perf_counter() - start < 10
