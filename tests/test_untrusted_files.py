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


def _mutations(rng, node):
    """Variants of one architecture node: numbers made absurd, negative, fractional or strings; keys
    dropped, renamed or added; types swapped; structure nested or emptied."""
    values = [0, -1, 2 ** 62, 2 ** 63 - 1, 2 ** 64, 1.5, -0.5, 1e308, "3", None, [], {}, [2 ** 40, 2 ** 40], True]
    types = ["Linear", "Conv2d", "LayerNorm", "Embedding", "LSTM", "MultiheadAttention", "Sequential", "Nope", ""]
    out = json.loads(json.dumps(node))
    config = out.setdefault("config", {}) if isinstance(out, dict) else {}
    choice = rng.integers(6)
    if choice == 0 and config:
        config[rng.choice(sorted(config))] = values[rng.integers(len(values))]
    elif choice == 1 and config:
        del config[rng.choice(sorted(config))]
    elif choice == 2:
        config[f"unknown_{rng.integers(3)}"] = values[rng.integers(len(values))]
    elif choice == 3:
        out["type"] = types[rng.integers(len(types))]
    elif choice == 4:
        out = {"type": "Sequential", "layers": [out] * int(rng.integers(0, 3))}
    else:
        out["config"] = values[rng.integers(len(values))]
    return out


def _seed_layers():
    """Architecture nodes as tl.save writes them, one per kind of saved layer."""
    modules = [tl.nn.Linear(3, 4), tl.nn.Conv2d(1, 2, 3, padding=1), tl.nn.LayerNorm(4), tl.nn.Embedding(5, 3),
               tl.nn.GroupNorm(2, 4), tl.nn.MaxPool2d(2), tl.nn.BatchNorm1d(4), tl.nn.ConvTranspose2d(2, 2, 3)]
    return [tl.io.describe(tl.nn.Sequential(m))["model"]["layers"][0] for m in modules]


@pytest.mark.parametrize("seed", range(3))
def test_mutated_architectures_are_refused_or_loaded_never_crash(tmp_path, seed):
    """Each mutation is loaded over the seed layer's real weights and over an empty payload: tl.load
    raises a ValueError or TypeError or returns a model; under tools/sanitize.sh it runs with ASan."""
    rng = np.random.default_rng(seed)
    seeds = _seed_layers()
    outcomes = {"refused": 0, "loaded": 0}
    for trial in range(60):
        layer = seeds[trial % len(seeds)]
        tl.manual_seed(0)
        honest = tl.io.build({"format": FORMAT, "model": {"type": "Sequential", "layers": [layer]}})
        tensors = {k: np.ascontiguousarray(v) for k, v in honest.state_dict().items()}
        mutated = _mutations(rng, layer)
        for payload in (tensors, {}):
            path = _forge(tmp_path / f"m{trial}.safetensors", [mutated], payload)
            try:
                net = tl.load(path)
            except (ValueError, TypeError, KeyError):
                outcomes["refused"] += 1
            else:
                outcomes["loaded"] += 1
                if not payload:  # weights from nowhere would be a silently made-up model
                    assert net.num_parameters() == 0, mutated
    assert outcomes["refused"] > 0, outcomes
