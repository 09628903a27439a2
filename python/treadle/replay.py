"""tl.ReplayBuffer: samples a running simulation pushes between its time steps, batches a trainer draws,
in the same process (the C++ core's buffer: no thread, no allocation after construction).

    buf = tl.ReplayBuffer({"x": (3,), "y": (1,)}, capacity=10_000, policy="firo", min_size=256, seed=0)
    for step in range(steps):
        state = simulate(state)
        buf.push(x=features(state), y=targets(state))     # (n, 3) and (n, 1): copied in
        if buf.ready(64):
            batch = buf.sample(64, out=batch)              # fills preallocated arrays
            trainer.step(batch["x"], batch["y"])

Policies: "fifo" (the oldest samples, each used once), "firo" (uniformly random distinct samples, each
leaving after max_reuse uses, default 1), "reservoir" (a uniform random subset of everything pushed,
Vitter's algorithm R; samples stay unless max_reuse is set). A full fifo or firo buffer drops its oldest
sample for a new one (`dropped` counts samples that left unsampled). Sampling below the watermark
(`min_size`, or fewer samples than the batch) raises ValueError and changes nothing. The buffer's state
(contents, counters, generator) goes into `tl.save_checkpoint(..., buffers={"name": buf})`.
"""
import numpy as np

from . import _core

__all__ = ["ReplayBuffer"]


def _field(name, spec):
    """(name, shape, dtype) from a shape, or a (shape, dtype) pair."""
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], (int, np.integer)) and \
            isinstance(spec[0], (tuple, list)):
        shape, dtype = spec
    else:
        shape, dtype = spec, "float32"
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return str(name), [int(d) for d in shape], np.dtype(dtype).name


class ReplayBuffer:
    """A buffer of samples with named fields of fixed shape: `fields` maps each name to a sample's shape,
    or to (shape, dtype) with dtype float32 (the default), float64, int64 or int32."""

    def __init__(self, fields, capacity, policy="firo", min_size=0, max_reuse=None, seed=0):
        specs = [_field(n, s) for n, s in dict(fields).items()]
        self._native = _core.ReplayBuffer(specs, str(policy), int(capacity), int(min_size),
                                          -1 if max_reuse is None else int(max_reuse), int(seed))
        self.fields = {n: (tuple(shape), np.dtype(dtype)) for n, shape, dtype in specs}

    def push(self, batch=None, **fields):
        """Copies n samples: a dict (or keywords) with every field, each of shape (n, *field shape) and
        the field's dtype. Everything is checked before anything is copied."""
        given = dict(batch or {}, **fields)
        unknown = sorted(set(given) - set(self.fields))
        missing = [n for n in self.fields if n not in given]
        if unknown or missing:
            raise ValueError(f"ReplayBuffer.push: fields {list(self.fields)} expected; "
                             + (f"missing {missing}" if missing else "") + (" " if missing and unknown else "")
                             + (f"unknown {unknown}" if unknown else ""))
        self._native.push([np.asarray(given[n]) for n in self.fields])

    def sample(self, batch_size, out=None):
        """batch_size samples by the policy, as {field: array of (batch_size, *shape)}: into `out` (a dict
        of preallocated C-contiguous arrays, returned) when given, else into new arrays."""
        batch_size = int(batch_size)
        if out is None:
            out = {n: np.empty((batch_size,) + shape, dtype) for n, (shape, dtype) in self.fields.items()}
        missing = [n for n in self.fields if n not in out]
        if missing:
            raise ValueError(f"ReplayBuffer.sample: out lacks fields {missing}")
        self._native.sample(batch_size, [out[n] for n in self.fields])
        return out

    def exchange(self, comm, count, round=0):  # noqa: A002 (the host's exchange counter)
        """Sends up to `count` samples to another rank of `comm` (an mpi4py communicator the host lends;
        treadle never initialises MPI) and pushes the samples another rank sends, so that each rank's
        batches mix simulations run elsewhere. Rank r sends to (r + k) % size and receives from
        (r - k) % size with k = 1 + round % (size - 1): successive rounds reach every rank. The samples
        sent are drawn by the policy, as sample() draws them (a firo sample moves, a reservoir one is
        copied); a rank below its watermark sends none. Collective: every rank of comm calls it with
        the same round. Buffers of another layout on the partner rank raise ValueError on every rank
        (nothing is sent). Returns the number of samples received."""
        size, rank = comm.Get_size(), comm.Get_rank()
        if size == 1:
            return 0
        k = 1 + int(round) % (size - 1)
        dest, source = (rank + k) % size, (rank - k) % size
        layout = self._native.layout
        partner = comm.sendrecv(layout, dest=dest, source=source)
        if not comm.allreduce(int(partner == layout), op=_mpi_min()):
            raise ValueError(f"ReplayBuffer.exchange: the buffers differ across ranks (this one '{layout}'"
                             + ("" if partner == layout else f", rank {source}'s '{partner}'") + ")")
        n = min(int(count), len(self))
        out = self.sample(n) if n > 0 and self.ready(n) else \
            {name: np.empty((0,) + shape, dtype) for name, (shape, dtype) in self.fields.items()}
        n = len(next(iter(out.values())))
        received = comm.sendrecv(n, dest=dest, source=source)
        got = {name: np.empty((received,) + shape, dtype) for name, (shape, dtype) in self.fields.items()}
        for name in self.fields:
            comm.Sendrecv(np.ascontiguousarray(out[name]), dest=dest, recvbuf=got[name], source=source)
        if received:
            self.push(got)
        return received

    def ready(self, batch_size):
        """Whether sample(batch_size) may run: at least max(min_size, batch_size) samples are held."""
        return self._native.ready(int(batch_size))

    def __len__(self):
        return self._native.size

    def state_dict(self):
        """The whole state ({"arrays": {...}, "metadata": {...}}, copies) for load_state_dict."""
        arrays, metadata = self._native.state()
        return {"arrays": dict(arrays), "metadata": dict(metadata)}

    def load_state_dict(self, state):
        """Restores a state_dict of a buffer with the same policy, capacity, max_reuse and fields; checked
        completely first (ValueError, nothing changed)."""
        self._native.load_state(dict(state["arrays"]), dict(state["metadata"]))

    capacity = property(lambda self: self._native.capacity)
    min_size = property(lambda self: self._native.min_size)
    max_reuse = property(lambda self: self._native.max_reuse)
    policy = property(lambda self: self._native.policy)
    pushed = property(lambda self: self._native.pushed, doc="samples offered to push, ever")
    dropped = property(lambda self: self._native.dropped, doc="samples that left without being sampled")
    sampled = property(lambda self: self._native.sampled, doc="samples handed out, ever (with repeats)")

    def __repr__(self):
        fields = ", ".join(f"{n}: {shape} {dtype}" for n, (shape, dtype) in self.fields.items())
        return (f"ReplayBuffer({self.policy}, {len(self)}/{self.capacity} held, min_size={self.min_size}, "
                f"max_reuse={self.max_reuse}; {fields})")


def _mpi_min():
    from mpi4py import MPI  # only a host that lends a communicator reaches this
    return MPI.MIN
