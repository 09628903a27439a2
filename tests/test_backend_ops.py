"""tl.backend_ops(backend): the ops each backend has kernels for, with their dtypes. The Eigen
reference covers every op another backend takes (so every node can fall back), in float32 and
float64; oneDNN lists float32 kernels only."""
import numpy as np
import pytest

import treadle as tl
from opcheck import run

DTYPES = {"float32", "float64", "bfloat16", "float16", "int32", "int64"}


def test_eigen_lists_its_kernels_with_dtypes():
    ops = tl.backend_ops("eigen")
    assert list(ops) == sorted(ops)
    for op in ("linear", "matmul", "conv", "conv_backward_weight", "lstm_layer", "softmax", "relu_backward"):
        assert ops[op] == ["float32", "float64"], op
    assert all(set(d) <= DTYPES and d for d in ops.values())
    # a view has no kernel: its node costs nothing
    assert "fused_activation" not in ops


def test_listed_eigen_op_runs():
    ops = tl.backend_ops("eigen")
    x, w = np.ones((3, 4), np.float64), np.ones((2, 4), np.float64)
    (y,), _ = run("linear", [x, w], {}, None, "eigen")
    np.testing.assert_array_equal(y, np.full((3, 2), 4.0))
    assert "float64" in ops["linear"]


@pytest.mark.parametrize("backend", [b for b in tl.backends() if b != "eigen"])
def test_every_backend_op_has_an_eigen_fallback(backend):
    eigen, ops = tl.backend_ops("eigen"), tl.backend_ops(backend)
    assert ops and list(ops) == sorted(ops)
    for op, dtypes in ops.items():
        assert op in eigen, f"{backend} takes {op}, which has no Eigen kernel to fall back to"
        assert set(dtypes) <= set(eigen[op]), op


@pytest.mark.skipif("onednn" not in tl.backends(), reason="treadle was built without oneDNN")
def test_onednn_lists_its_families_in_float32():
    ops = tl.backend_ops("onednn")
    for op in ("linear", "matmul", "bmm", "conv", "conv_backward_data", "conv_backward_weight", "softmax",
               "layer_norm", "max_pool", "avg_pool", "lstm_layer", "lstm_layer_backward", "gru_layer",
               "gru_layer_backward"):
        assert ops.get(op) == ["float32"], op
    assert "batch_norm" not in ops and "rnn_layer" not in ops


def test_unknown_backend_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown backend 'tpu' \(available: .*eigen\)"):
        tl.backend_ops("tpu")


@pytest.mark.skipif("cuda" in tl.backends(), reason="this build has the CUDA backend")
def test_cuda_in_a_build_without_it_says_how_to_get_it():
    model = tl.nn.Sequential(tl.nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"unknown backend 'cuda': this build has no CUDA support "
                                         r"\(configure with -DTREADLE_WITH_CUDA=ON\); available: .*eigen"):
        model.set_backend("cuda")
    np.testing.assert_array_equal(model.predict(np.zeros((4, 3), np.float32)).shape, (4, 2))  # unchanged
    with pytest.raises(ValueError, match="this build has no CUDA support"):
        tl.backend_ops("cuda")
    with pytest.raises(ValueError, match=r"unknown backend 'cuda:1': this build has no CUDA support"):
        model.set_backend("cuda:1")


@pytest.mark.parametrize("name, message", [
    ("eigen:1", r"backend 'eigen:1': 'eigen' runs on the CPU and takes no device index"),
    ("cuda:x", r"backend 'cuda:x': a device index follows the ':' as a number \(.cuda:1.\)"),
    ("cuda:", r"backend 'cuda:': a device index follows the ':' as a number"),
    ("cuda:-1", r"backend 'cuda:-1': a device index follows the ':' as a number"),
])
def test_a_device_index_is_a_number_and_only_for_a_device_backend(name, message):
    # "cuda:1" pins plans to the second GPU; the index is checked before anything else about the name.
    model = tl.nn.Sequential(tl.nn.Linear(3, 2))
    with pytest.raises(ValueError, match=message):
        model.set_backend(name)
    assert model.predict(np.zeros((4, 3), np.float32)).shape == (4, 2)  # the model is unchanged


@pytest.mark.skipif("cuda" in tl.backends(), reason="this build has the CUDA backend")
def test_cuda_graph_option_in_a_build_without_cuda_is_a_value_error():
    model = tl.nn.Sequential(tl.nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"cuda_graph=True needs a build with the CUDA backend .*this build has .*eigen"):
        tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.1), cuda_graph=True)
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.SGD(lr=0.1), cuda_graph=False)
    assert np.isfinite(trainer.step(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)))
