"""Deterministic mode (model.deterministic = True): runs agree to the bit whatever the environment.

Plans compiled in this mode ignore the measured dispatch table (an input from outside the program)
and keep the fixed priority order, skip kernels a backend marks non-deterministic, and give the same
bits for any executor chunking; switching it recompiles."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import treadle as tl

HAS_ONEDNN = "onednn" in tl.backends()


@pytest.fixture(autouse=True)
def no_table(monkeypatch):
    monkeypatch.delenv("TREADLE_DISPATCH_TABLE", raising=False)
    tl.load_dispatch_table(None)
    yield
    tl.load_dispatch_table(None)


def mlp(seed=3):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Linear(64, 256), tl.nn.ReLU(), tl.nn.Dropout(0.1), tl.nn.Linear(256, 256),
                            tl.nn.Tanh(), tl.nn.Linear(256, 4))


def linear_backends(model):
    return [b for op, b in re.findall(r"^\d+ (\S+) \[(\w+)\]", model._compiled().describe_plans(), flags=re.M)
            if op == "linear"]


def train(deterministic, executor=None, backend="auto", steps=5):
    model = mlp()
    model.set_backend(backend)
    model.deterministic = deterministic
    trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.Adam(lr=1e-3), seed=9, executor=executor)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    y = rng.standard_normal((300, 4)).astype(np.float32)
    losses = [trainer.step(x, y) for _ in range(steps)]
    return model, losses


def test_switch_is_off_by_default_and_recompiles():
    model = mlp()
    assert model.deterministic is False
    model.predict(np.ones((2, 64), np.float32))
    assert model._compiled().num_plans == 1
    model.deterministic = True
    assert model.deterministic is True and model._compiled().num_plans == 0
    model.predict(np.ones((2, 64), np.float32))
    assert model._compiled().num_plans == 1


def test_deterministic_runs_agree_bitwise_for_any_chunking():
    reference, ref_losses = train(True)
    with ThreadPoolExecutor(3) as pool:
        pooled, losses = train(True, tl.PoolExecutor(pool, 3))
    assert losses == ref_losses
    np.testing.assert_array_equal(pooled.flat_parameters(), reference.flat_parameters())


def test_deterministic_auto_ignores_the_dispatch_table(tmp_path):
    # A table that sends every linear to the reference: "auto" follows it, deterministic mode does not.
    path = tmp_path / "eigen_everywhere.json"
    path.write_text(json.dumps({"format": "treadle-dispatch-table", "version": 1, "conditions": {},
                                "rules": [{"op": "linear", "dtype": "float32", "measure": "macs", "from": 0,
                                           "backend": "eigen"}]}))
    tl.load_dispatch_table(path)
    measured, _ = train(False, steps=1)
    fixed, _ = train(True, steps=1)
    priority, _ = train(False, backend="", steps=1)
    assert set(linear_backends(measured)) == {"eigen"}
    assert linear_backends(fixed) == linear_backends(priority)
    if HAS_ONEDNN:  # the table and the priority order differ only where oneDNN takes a node
        assert "onednn" in linear_backends(fixed)


def test_deterministic_equals_the_priority_order_bitwise():
    _, fixed = train(True)
    _, priority = train(False, backend="")
    assert fixed == priority


def test_a_pinned_backend_stays_pinned():
    model, _ = train(True, backend="eigen", steps=1)
    assert set(linear_backends(model)) == {"eigen"}
