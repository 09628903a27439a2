"""tl.ReplayBuffer: the fifo / firo / reservoir policies sample what they promise (order, distinctness,
reuse limits, algorithm R's inclusion probability over many seeds, uniform draws), sampling below the
watermark and bad pushes raise and change nothing, seeded runs repeat, and a checkpoint with its
buffers resumes a training run that samples from them bit for bit."""
import numpy as np
import pytest

import treadle as tl


def ids_buffer(policy, capacity, **kw):
    return tl.ReplayBuffer({"id": ((), "int64"), "x": (2,)}, capacity=capacity, policy=policy, **kw)


def push_ids(buf, ids):
    ids = np.asarray(ids, np.int64)
    buf.push(id=ids, x=np.stack([ids, -ids], 1).astype(np.float32))


def test_fifo_hands_out_the_oldest_once_and_drops_the_oldest_when_full():
    buf = ids_buffer("fifo", 4)
    push_ids(buf, range(6))  # 0 and 1 dropped
    assert (len(buf), buf.dropped, buf.pushed) == (4, 2, 6)
    batch = buf.sample(3)
    np.testing.assert_array_equal(batch["id"], [2, 3, 4])
    np.testing.assert_array_equal(batch["x"], [[2, -2], [3, -3], [4, -4]])
    push_ids(buf, [6, 7])
    np.testing.assert_array_equal(buf.sample(3)["id"], [5, 6, 7])
    assert len(buf) == 0 and buf.sampled == 6
    with pytest.raises(ValueError, match="fifo buffer hands each sample out once"):
        ids_buffer("fifo", 4, max_reuse=2)


@pytest.mark.parametrize("max_reuse", [1, 3])
def test_firo_draws_distinct_samples_and_retires_them_after_max_reuse(max_reuse):
    buf = ids_buffer("firo", 8, max_reuse=max_reuse, seed=3)
    push_ids(buf, range(8))
    uses = np.zeros(8, int)
    while buf.ready(4):
        batch = buf.sample(4)["id"]
        assert len(set(batch)) == 4  # distinct within a batch
        np.add.at(uses, batch, 1)
    assert uses.max() <= max_reuse
    assert (uses == max_reuse).sum() == 8 - len(buf)  # retired exactly at their limit; the rest still held


def test_firo_full_drops_its_oldest_live_sample():
    buf = ids_buffer("firo", 5, seed=1, max_reuse=0)
    push_ids(buf, range(5))
    push_ids(buf, [100])
    assert set(buf.sample(5)["id"]) == {1, 2, 3, 4, 100} and buf.dropped == 1
    # Retired samples leave stale places in the arrival order; the oldest *live* sample goes next.
    buf = ids_buffer("firo", 4, seed=2)  # max_reuse 1
    push_ids(buf, range(4))
    buf.sample(2)
    push_ids(buf, [10, 11])  # into the two freed slots
    push_ids(buf, [12] * 3)  # full: evicts the two remaining originals (oldest first), then 10
    assert buf.dropped == 3
    assert sorted(buf.sample(4)["id"]) == [11, 12, 12, 12]


def test_reservoir_keeps_each_pushed_sample_with_probability_capacity_over_n():
    n, k, seeds = 40, 10, 3000
    kept = np.zeros(n)
    for seed in range(seeds):
        buf = ids_buffer("reservoir", k, seed=seed)
        for i in range(n):  # one at a time, as a simulation's steps would
            push_ids(buf, [i])
        kept[buf.sample(k)["id"]] += 1
    expected, sd = k / n, np.sqrt(k / n * (1 - k / n) / seeds)
    assert np.abs(kept / seeds - expected).max() < 5 * sd, kept / seeds
    assert buf.dropped == n - k


def test_reservoir_draws_uniformly_and_keeps_samples_without_a_limit():
    buf = ids_buffer("reservoir", 6, seed=5)
    push_ids(buf, range(6))
    counts = np.zeros(6)
    for _ in range(6000):
        counts[buf.sample(2)["id"]] += 1
    assert len(buf) == 6  # max_reuse 0: nothing leaves
    assert np.abs(counts / counts.sum() - 1 / 6).max() < 0.01


def test_same_seed_same_batches_and_state_dict_resumes():
    a, b = ids_buffer("firo", 50, seed=9, max_reuse=2), ids_buffer("firo", 50, seed=9, max_reuse=2)
    for buf in (a, b):
        push_ids(buf, range(40))
    first = [a.sample(5)["id"] for _ in range(3)]
    np.testing.assert_array_equal(first, [b.sample(5)["id"] for _ in range(3)])
    state = a.state_dict()

    def rest(buf):  # overflowing pushes (the arrival order decides what goes) between draws
        out = []
        for k in range(4):
            push_ids(buf, range(100 + 10 * k, 110 + 10 * k))
            out.append(buf.sample(5)["id"])
        return out

    expected = rest(a)
    c = ids_buffer("firo", 50, seed=0, max_reuse=2)  # another seed: the state's generator takes over
    c.load_state_dict(state)
    np.testing.assert_array_equal(rest(c), expected)
    assert a.dropped > 0 and c.dropped == a.dropped


def test_below_the_watermark_and_bad_pushes_change_nothing():
    buf = ids_buffer("firo", 10, min_size=4, seed=2)
    push_ids(buf, range(3))
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"3 samples held, 4 needed \(batch_size 2, min_size 4\)"):
        buf.sample(2)
    with pytest.raises(ValueError, match=r"field 'x' must be float32 of shape \(n, 2\), got float32 \(3, 3\)"):
        buf.push(id=np.arange(3), x=np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="field 'id' must be int64"):
        buf.push(id=np.arange(3.0), x=np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="different numbers of samples"):
        buf.push(id=np.arange(2), x=np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"missing \['x'\]"):
        buf.push(id=np.arange(3))
    after = buf.state_dict()
    assert after["metadata"] == before["metadata"]
    for name in before["arrays"]:
        np.testing.assert_array_equal(after["arrays"][name], before["arrays"][name])


def test_strided_pushes_and_preallocated_outputs():
    buf = tl.ReplayBuffer({"x": (3,)}, capacity=8, policy="fifo")
    data = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # strided
    buf.push(x=data)
    out = {"x": np.empty((4, 3), np.float32)}
    assert buf.sample(4, out=out) is out
    np.testing.assert_array_equal(out["x"], data)
    buf.push(x=data)
    with pytest.raises(ValueError, match="is not C-contiguous"):
        buf.sample(4, out={"x": np.empty((4, 6), np.float32)[:, ::2]})


def test_bad_construction_is_named():
    with pytest.raises(ValueError, match="capacity must be positive"):
        tl.ReplayBuffer({"x": (2,)}, capacity=0)
    with pytest.raises(ValueError, match="policy must be 'fifo', 'firo' or 'reservoir'"):
        tl.ReplayBuffer({"x": (2,)}, capacity=4, policy="lifo")
    with pytest.raises(ValueError, match=r"min_size must be in \[0, capacity = 4\]"):
        tl.ReplayBuffer({"x": (2,)}, capacity=4, min_size=5)
    with pytest.raises(ValueError, match="must be float32, float64, int64 or int32"):
        tl.ReplayBuffer({"x": ((2,), "float16")}, capacity=4)


def _online_run(steps, path=None, resume_from=None, save_at=None):
    """A surrogate trained online: each step pushes 8 new samples of y = sin(x) and trains on a batch of
    16 drawn from the buffer. Returns (parameters, last batch)."""
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(1, 8), tl.nn.Tanh(), tl.nn.Linear(8, 1)).double()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=0.01))
    buf = tl.ReplayBuffer({"x": ((1,), "float64"), "y": ((1,), "float64")}, capacity=64, policy="reservoir",
                          min_size=16, seed=11)
    start = 0
    if resume_from is not None:
        tl.load_checkpoint(resume_from, trainer, buffers={"sim": buf})
        start = save_at
    batch = None
    for step in range(start, steps):
        x = np.linspace(-2, 2, 8).reshape(8, 1) + 0.01 * step
        buf.push(x=x, y=np.sin(x))
        if buf.ready(16):
            batch = buf.sample(16)
            trainer.step(batch["x"], batch["y"])
        if path is not None and step + 1 == save_at:
            tl.save_checkpoint(path, trainer, buffers={"sim": buf})
    return net.parameters_vector() if hasattr(net, "parameters_vector") else \
        np.concatenate([p.ravel() for p in net.parameters()]), batch


def test_checkpoint_with_buffers_resumes_bit_for_bit(tmp_path):
    path = tmp_path / "online.treadle"
    whole, last = _online_run(12, path=path, save_at=5)
    resumed, resumed_last = _online_run(12, resume_from=path, save_at=5)
    np.testing.assert_array_equal(resumed, whole)
    np.testing.assert_array_equal(resumed_last["x"], last["x"])
    assert tl.load(path) is not None  # still a model file too


def test_checkpoint_of_another_buffer_layout_changes_nothing(tmp_path):
    path = tmp_path / "online.treadle"
    _online_run(6, path=path, save_at=6)
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(1, 8), tl.nn.Tanh(), tl.nn.Linear(8, 1)).double()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=0.01))
    before = [p.copy() for p in net.parameters()]
    other = tl.ReplayBuffer({"x": ((1,), "float64"), "y": ((1,), "float64")}, capacity=32, policy="reservoir")
    with pytest.raises(ValueError, match="saved for a buffer 'reservoir capacity 64"):
        tl.load_checkpoint(path, trainer, buffers={"sim": other})
    missing = tl.ReplayBuffer({"x": ((1,), "float64"), "y": ((1,), "float64")}, capacity=64, policy="reservoir")
    with pytest.raises(ValueError, match="no replay buffer state under this name"):
        tl.load_checkpoint(path, trainer, buffers={"other": missing})
    for p, q in zip(net.parameters(), before):
        np.testing.assert_array_equal(p, q)
    assert len(other) == 0 and len(missing) == 0
