"""Misuse that used to hang, truncate or fail late with an unrelated error: each is now refused up front
with an error that names the argument, and nothing is half done."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treadle as tl


def _net():
    tl.manual_seed(0)
    return tl.nn.Sequential(tl.nn.Linear(3, 4), tl.nn.Tanh(), tl.nn.Linear(4, 1))


def test_loading_a_fifo_is_refused_instead_of_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    script = textwrap.dedent(f"""
        import treadle as tl
        for call in (tl.load, tl.io.read_metadata, tl.io.load_file):
            try:
                call({str(fifo)!r})
            except ValueError as e:
                assert "not a regular file" in str(e), e
            else:
                raise AssertionError(f"{{call.__name__}} accepted a FIFO")
        print("refused")
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("save", ["model", "checkpoint"])
def test_a_path_with_a_nul_byte_is_refused_and_writes_nothing(tmp_path, save):
    net = _net()
    path = str(tmp_path / "net.safetensors") + "\0.bak"
    with pytest.raises(ValueError, match="NUL byte"):
        if save == "model":
            tl.save(net, path)
        else:
            tl.save_checkpoint(path, tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1)))
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="NUL byte"):
        tl.load(path)


@pytest.mark.parametrize("missing", ["model", "loss", "optimizer"])
def test_trainer_names_a_missing_argument(missing):
    args = {"model": _net(), "loss": tl.loss.MSE(), "optimizer": tl.optim.Adam(lr=1e-3)}
    args[missing] = None
    with pytest.raises(TypeError, match=f"Trainer: {missing} must be"):
        tl.Trainer(**args)


@pytest.mark.parametrize("clip", [math.nan, math.inf, 0.0, -1.0])
def test_trainer_refuses_a_clip_norm_that_is_not_finite_and_positive(clip):
    with pytest.raises(ValueError, match="clip_grad_norm must be positive and finite"):
        tl.Trainer(_net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-3), clip_grad_norm=clip)


def test_checkpoints_need_a_trainer_not_a_model(tmp_path):
    net = _net()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.step(np.ones((2, 3), np.float32), np.ones((2, 1), np.float32))
    path = tmp_path / "ckpt.safetensors"
    tl.save_checkpoint(path, trainer)
    before = net.state_dict()
    with pytest.raises(TypeError, match="load_checkpoint: expected a tl.Trainer"):
        tl.load_checkpoint(path, net)
    with pytest.raises(TypeError, match="save_checkpoint: expected a tl.Trainer"):
        tl.save_checkpoint(tmp_path / "other.safetensors", net)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("bad", ["wrong_width", "wrong_dtype", "unpaired", "empty", "not_a_pair"])
def test_fit_refuses_bad_validation_data_before_training(bad):
    net = _net()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    x, y = np.ones((8, 3), np.float32), np.zeros((8, 1), np.float32)
    validation = {"wrong_width": (np.ones((4, 5), np.float32), np.zeros((4, 1), np.float32)),
                  "wrong_dtype": (np.ones((4, 3), np.int64), np.zeros((4, 1), np.float32)),  # float64 is cast
                  "unpaired": (np.ones((4, 3), np.float32), np.zeros((3, 1), np.float32)),
                  "empty": (np.ones((0, 3), np.float32), np.zeros((0, 1), np.float32)),
                  "not_a_pair": np.ones((4, 3), np.float32)}[bad]
    before = net._compiled().flat_parameters().copy()
    with pytest.raises(ValueError, match="fit: validation"):
        trainer.fit(x, y, epochs=2, batch_size=4, validation=validation)
    np.testing.assert_array_equal(net._compiled().flat_parameters(), before)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("make", [lambda v: tl.optim.SGD(lr=v), lambda v: tl.optim.Adam(lr=v),
                                  lambda v: tl.optim.Adam(eps=v), lambda v: tl.optim.SGD(momentum=v)])
def test_optimizers_refuse_non_finite_hyper_parameters(make, value):
    with pytest.raises(ValueError):
        make(value)


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_a_bound_optimizer_refuses_a_bad_lr_and_keeps_its_own(value):
    opt = tl.optim.Adam(lr=1e-3)
    tl.Trainer(_net(), tl.loss.MSE(), opt)
    with pytest.raises(ValueError, match="lr"):
        opt.lr = value
    assert opt.lr == pytest.approx(1e-3)


_HUGE_SIZES_SCRIPT = """
import random, sys
import treadle as tl
rng = random.Random(int(sys.argv[1]))
makers = {
    "Linear": lambda a, b: tl.nn.Linear(a, b), "Embedding": lambda a, b: tl.nn.Embedding(a, b),
    "LayerNorm": lambda a, b: tl.nn.LayerNorm((a, b)), "BatchNorm1d": lambda a, b: tl.nn.BatchNorm1d(a),
    "GroupNorm": lambda a, b: tl.nn.GroupNorm(1, a), "Conv2d": lambda a, b: tl.nn.Conv2d(a, b, 3),
    "Conv2d-kernel": lambda a, b: tl.nn.Conv2d(2, 2, (a, b)), "LSTM": lambda a, b: tl.nn.LSTM(a, b),
    "MultiheadAttention": lambda a, b: tl.nn.MultiheadAttention(a, 1),
}
refused = 0
for i in range(60):
    name = rng.choice(sorted(makers))
    # every size past any machine's memory (2^46 elements and up) or negative
    a, b = (rng.choice([2 ** rng.randint(46, 62), -rng.randint(1, 2 ** 40), 2 ** 62 - 1]) for _ in range(2))
    try:
        makers[name](a, b)
    except (ValueError, TypeError, OverflowError):
        refused += 1
    else:
        raise AssertionError(f"{name}({a}, {b}) was accepted")
print("refused", refused)
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_absurd_layer_sizes_are_refused_without_a_crash(seed):
    """Sizes that overflow 64-bit element or byte counts used to wrap around and crash (SIGSEGV)."""
    proc = subprocess.run([sys.executable, "-c", _HUGE_SIZES_SCRIPT, str(seed)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "refused 60" in proc.stdout


@pytest.mark.parametrize("make", [lambda: tl.nn.Linear(1, 2 ** 62), lambda: tl.nn.LayerNorm((2 ** 31, 2 ** 31)),
                                  lambda: tl.nn.Conv2d(3, 3, 2 ** 31)])
def test_an_absurd_size_is_named_by_its_layer(make):
    with pytest.raises(ValueError, match=r"^(Linear|LayerNorm|Conv2d)\(.*(bytes one tensor may hold|overflows)"):
        make()


@pytest.mark.parametrize("make,name", [
    (lambda: tl.nn.Linear(2.9, 3), "Linear: in_features must be an int, got float 2.9"),
    (lambda: tl.nn.Linear(True, 3), "Linear: in_features must be an int, got bool"),
    (lambda: tl.nn.Embedding(10.0, 3), "Embedding: num_embeddings must be an int"),
    (lambda: tl.nn.Embedding(10, 3, padding_idx=1.5), "Embedding: padding_idx must be an int"),
    (lambda: tl.nn.LSTM(3.5, 4), "LSTM: input_size must be an int"),
    (lambda: tl.nn.GRU(3, 4, num_layers=2.0), "GRU: num_layers must be an int"),
    (lambda: tl.nn.Conv2d(3.0, 2, 3), "Conv2d: in_channels must be an int"),
    (lambda: tl.nn.GroupNorm(2, 4.0), "GroupNorm: num_channels must be an int"),
    (lambda: tl.nn.BatchNorm1d(4.5), "BatchNorm1d: num_features must be an int"),
    (lambda: tl.nn.LayerNorm((4.5,)), r"LayerNorm: expected an int or a sequence of ints, got \(4.5,\)"),
    (lambda: tl.nn.MultiheadAttention(8, 2.0), "MultiheadAttention: num_heads must be an int"),
])
def test_a_size_that_is_not_an_integer_is_refused_not_truncated(make, name):
    """torch.nn refuses Linear(2.9, 3); truncating it to Linear(2, 3) would build another model."""
    with pytest.raises(TypeError, match=name):
        make()
    assert tl.nn.Linear(np.int64(3), 2).in_features == 3  # numpy integers are integers


def test_binding_a_shape_whose_size_overflows_is_refused():
    with pytest.raises(ValueError, match="overflows a 64-bit integer"):
        tl.optim.Adam().bind([("w", (2 ** 32, 2 ** 32))], "float32")


def test_outputs_past_every_machines_memory_are_refused_where_the_op_is_traced():
    """An accepted layer whose output size an attribute decides (adaptive pooling to 2**46 rows, past
    the 2**47-byte cap on any machine): the size used to reach malloc (predict's output, the plan's
    arena), which aborts the process under ASan instead of failing."""
    x = np.ones((1, 1, 2, 2), np.float32)
    message = r"adaptive_avg_pool: an output of shape \(1, 1, 70368744177664, 1\) and dtype float32 needs more"
    with pytest.raises(ValueError, match=message):
        tl.nn.Sequential(tl.nn.AdaptiveAvgPool2d((2 ** 46, 1))).predict(x)
    inner = tl.nn.Sequential(tl.nn.AdaptiveAvgPool2d((2 ** 46, 1)), tl.nn.AdaptiveAvgPool2d((1, 1)))
    with pytest.raises(ValueError, match=message):
        inner.predict(x)
    with pytest.raises(ValueError, match=r"upsample2d: an output's shape .* overflows a 64-bit integer"):
        tl.nn.Sequential(tl.nn.Upsample(size=2 ** 62)).predict(x)
