"""Data-parallel training over a communicator that the host lends (mpi4py).

treadle joins the host's MPI job as a guest: it never calls MPI_Init or MPI_Finalize and never
reaches for COMM_WORLD. The host passes the communicator to use (COMM_WORLD, or a group made with
``comm.Split`` when it trains several models at once)::

    from mpi4py import MPI
    import treadle as tl
    from treadle.distributed import DataParallel

    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
    dp = DataParallel(trainer, MPI.COMM_WORLD)      # same architecture everywhere; root's weights
    for x_shard, y_shard in my_batches():           # each rank its own part of the global batch
        loss = dp.step(x_shard, y_shard)            # global mean loss, same on every rank

Every step costs one small allreduce (sample count, loss, error flag: 3 float64) and one allreduce
of the flat gradient buffer; then every rank applies the same update, so replicas stay identical
without ever sending parameters again. See docs/distributed.md for the cost model and measurements.

The algorithm is written once, in C++ (treadle::DataParallelCore, the core library): this class is
a thin wrapper over its binding, which runs it over the mpi4py communicator (treadle._core calls
mpi4py for each collective, so no MPI is linked into treadle). With the optional extension
treadle._distributed (a build with -DTREADLE_WITH_MPI=ON; with -DTREADLE_WITH_NCCL=ON for NCCL) the
same algorithm runs over the MPI communicator of the C++ treadle::DataParallel instead, which is how a
model on backend "cuda" allreduces its gradients on the device (transport="nccl").
"""
import numpy as np

from . import _core

__all__ = ["DataParallel"]


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:  # an optional extra
        raise ImportError("treadle.distributed needs mpi4py: pip install 'treadle[mpi]'") from e
    return MPI


_BUILD_HINT = ("configure with -DTREADLE_BUILD_PYTHON=ON -DTREADLE_WITH_MPI=ON -DTREADLE_WITH_CUDA=ON "
               "-DTREADLE_WITH_NCCL=ON and mpi4py installed (pip: -Ccmake.define.TREADLE_WITH_MPI=ON and the "
               "others alike; docs/distributed.md, 'Transports')")


def _native_module():
    """treadle._distributed (the bound C++ treadle::DataParallel), or None where it was not built."""
    try:
        from . import _distributed
    except ImportError as e:
        _native_module.error = e
        return None
    return _distributed


def _on_cuda(backend):
    """Whether a model pinned to `backend` runs on a CUDA device ("cuda", "cuda:1")."""
    return backend.split(":")[0] == "cuda"


def _implementation_wish(trainer, transport, native):
    """What this rank asks for: "native" (treadle._distributed), "mpi4py" (treadle._core over the mpi4py
    communicator), or "auto" (treadle._distributed with NCCL if every rank can have it). Raises ValueError
    where the request cannot be met."""
    if native is False:
        if transport == "nccl":
            raise ValueError("transport 'nccl' needs the C++ treadle::DataParallel, but native=False asks for "
                             "the mpi4py implementation; use transport 'mpi'")
        return "mpi4py"
    if native is None and transport == "mpi":
        return "mpi4py"
    module = _native_module()
    if module is None and (native or transport == "nccl"):
        what = "transport 'nccl' is not available from Python" if transport == "nccl" else "native=True"
        raise ValueError(f"{what}: it needs treadle._distributed, the binding of the C++ treadle::DataParallel, "
                         f"which this installation lacks ({_native_module.error}): {_BUILD_HINT}; or use "
                         "transport 'mpi'")
    if native:
        return "native"
    if transport == "nccl":
        if not module.has_nccl:
            raise ValueError("transport 'nccl' is not available from Python: treadle._distributed, the binding of "
                             "the C++ treadle::DataParallel, was built without NCCL: " + _BUILD_HINT +
                             "; or use transport 'mpi'")
        backend = trainer.model._compiled().backend
        if not _on_cuda(backend):  # the C++ class would refuse it too; this says it in this module's words
            where = f"'{backend}'" if backend else "automatic host dispatch"
            raise ValueError("transport 'nccl' is not available from Python: the NCCL transport of "
                             "the C++ treadle::DataParallel needs the model on backend 'cuda', but its backend is "
                             f"{where}: set the model's backend to 'cuda' first, or use transport 'mpi'")
        return "native"
    capable = module is not None and module.has_nccl and _on_cuda(trainer.model._compiled().backend)
    return "auto" if capable else "mpi4py"


class DataParallel:
    """Keeps replicas of one Trainer in step across the ranks of ``comm``.

    Construction is collective (every rank of ``comm`` must construct it, with the same ``root``):
    it checks that all ranks hold the same architecture (parameter names, shapes, dtype, count) and
    the same loss, optimizer and schedule settings, raising the same ValueError on every rank if not,
    then broadcasts the parameters and the optimizer state (with its step count) from ``root``.

    ``step`` and ``allreduce_gradients`` are collective too: every rank calls them once per step.

    ``buffers``: what to do with state that is not trained but changes while training (BatchNorm's
    running_mean / running_var / num_batches_tracked: parameters with requires_grad=False), which
    each rank updates from its own shard. "root" (default, as torch's DistributedDataParallel):
    after each gradient allreduce every rank takes the root's values; "average": the mean over the
    ranks; "local": left alone (replicas then differ in that state). Batch statistics used *inside*
    a training step are always the local shard's (no SyncBatchNorm).

    ``transport``: how the gradient buffer travels. "mpi": through host memory with MPI (a model on
    backend "cuda" downloads its gradients for the allreduce and uploads them for the update). "nccl":
    NCCL allreduces the gradients in place on the device, through the C++ ``treadle::DataParallel``
    that the optional extension treadle._distributed binds (a build with -DTREADLE_WITH_NCCL=ON, a
    model on backend "cuda", one GPU per process; without the extension it raises a ValueError
    saying how to build it). "auto" (default): "nccl" where the extension has NCCL and every rank's
    model is on "cuda" (and the C++ class finds a GPU per process, else it keeps to "mpi"); "mpi"
    otherwise. ``self.transport`` is the one in use.

    ``timeout``: seconds a step waits in its first collective for every rank to arrive (None, the
    default: as long as MPI waits, which is forever for a rank that left early or died outside
    treadle without aborting the job). When not every rank arrives in time, ``step`` raises
    TimeoutError on the ranks that did; the collective stays pending on ``comm``, so this object
    refuses every later call and the host should end the job (``comm.Abort(1)``).

    ``native``: which communicator the (one, C++) algorithm runs over. None (default): the
    treadle::DataParallel of treadle._distributed for "nccl" and where "auto" chooses it as above,
    the mpi4py communicator otherwise. True: treadle._distributed whatever the transport (ValueError
    without the extension). False: the mpi4py communicator ("nccl" is then refused). Both give the
    same results, errors and attributes; every rank must make the same choice (else the same
    ValueError on every rank).
    """

    BUFFER_MODES = ("root", "average", "local")
    TRANSPORTS = ("auto", "mpi", "nccl")

    def __init__(self, trainer, comm, root=0, buffers="root", transport="auto", native=None, timeout=None):
        _mpi()
        _core.data_parallel_check_comm(comm)  # TypeError / ValueError here, before any collective
        self.comm, self.trainer = comm, trainer
        # What only Python knows (which module, the optimizer's and schedule's Python settings): each
        # rank finds its own, then all agree. The arguments are checked by the C++ constructor.
        error, wish, setup = None, None, None
        try:
            if native not in (None, True, False):
                raise ValueError(f"native must be None, True or False, got {native!r}")
            setup = _host_setup(trainer)
            wish = _implementation_wish(trainer, transport, native)
        except Exception as e:  # e.g. not a treadle Trainer, or transport 'nccl' unavailable
            error = e
        seen = comm.allgather((wish, None if error is None else (_describe(error) or type(error).__name__)))
        messages = [m or "" for _w, m in seen]
        if any(messages):
            text = _core.data_parallel_failure(messages, "DataParallel")
            raise ValueError(text) from (error if isinstance(error, BaseException) else None)
        # "auto" takes treadle._distributed only where every rank can.
        wishes = [w for w, _m in seen]
        labels = ["treadle._distributed" if w == "native" or (w == "auto" and set(wishes) <= {"native", "auto"})
                  else "mpi4py" for w in wishes]
        ref = root if _is_rank(root, len(labels)) else 0
        bad = next((r for r, label in enumerate(labels) if label != labels[ref]), None)
        if bad is not None:
            raise ValueError(f"DataParallel: implementation is {labels[bad]} on rank {bad} but {labels[ref]} on "
                             f"root rank {ref}")
        module = _native_module() if labels[comm.Get_rank()] == "treadle._distributed" else _core
        self._impl = module.DataParallel(trainer._native, comm, root, buffers, transport, timeout, setup)
        self._native = None if module is _core else self._impl  # the bound treadle::DataParallel, when it runs
        impl = self._impl
        self.rank, self.size, self.root, self.buffers = impl.rank, impl.size, impl.root, impl.buffers
        self.timeout = impl.timeout or None
        self.transport = impl.transport

    def sync_buffers(self):
        """Makes the non-trained state (BatchNorm running statistics) agree per ``buffers`` (collective).

        ``step`` and ``allreduce_gradients`` call it; it is public for hosts that change that state
        themselves. Does nothing (and communicates nothing) when the model has no such state or
        ``buffers="local"``.
        """
        self._impl.sync_buffers()

    def broadcast_state(self):
        """Copies root's parameters, optimizer state and step count to every rank (collective)."""
        self._impl.broadcast_state()

    def step(self, x, y):
        """One data-parallel training step on this rank's shard; returns the global mean loss.

        Shards may differ in size (even be empty on some ranks): the gradient is that of the loss over
        the global batch. If any rank fails (bad input, an error in the model), no rank updates and
        every rank raises ValueError("DataParallel.step: rank R failed: ...").
        """
        impl, where = self._impl, "DataParallel.step"
        impl.begin_step(where)  # zero_grad; keeps the running statistics to put back after a failure
        count, loss, error = 0, 0.0, None
        try:
            x, y = _contiguous(x), _contiguous(y)
            count = impl.shard_count(tuple(x.shape), tuple(y.shape))
            if count:
                loss = self.trainer.compute_gradients(x, y)
        except Exception as e:  # reported to every rank, then raised everywhere
            error = e
        return self._exchange(impl.end_step, count, loss, error, where)  # and update

    def allreduce_gradients(self, count, loss=0.0, error=None):
        """Sums the ranks' gradients into the gradient of the global loss (collective); returns its value.

        For a host that runs the phases itself: ``zero_grad``, ``compute_gradients`` (or ``forward`` +
        ``backward``) on the local shard, then this, then ``trainer.update()`` on every rank.

        ``count``: how many terms the local mean loss averaged over (the shard's sample count when all
        samples have the same size; the number of target elements in general; 0 for an empty shard).
        ``loss``: this rank's loss value. With reduction="mean" the local gradient is weighted by
        count / global count before the sum; with "sum" the gradients are just summed. ``error``: an
        exception (or message) this rank hit; if any rank passes one, every rank raises ValueError
        naming the first failing rank and nothing is summed.
        """
        return self._exchange(self._impl.allreduce_gradients, count, loss, error, "DataParallel.allreduce_gradients")

    def _exchange(self, call, count, loss, error, where):
        if error is None:
            try:
                loss = float(loss)
            except Exception as e:  # reported to every rank like any other failure
                error = e
        message = "" if error is None else (_describe(error) or type(error).__name__)
        try:
            return call(count, loss if error is None else 0.0, message, where)
        except ValueError as e:
            if isinstance(error, BaseException):
                raise e from error  # the failing rank's own exception as the cause
            raise

    @property
    def steps(self):
        """Data-parallel steps taken (successful gradient allreduces)."""
        return self._impl.steps

    @property
    def wait_seconds(self):
        """In the small allreduce (count, loss, flag): waiting for the slowest rank, all steps."""
        return self._impl.wait_seconds

    @property
    def allreduce_seconds(self):
        """In the gradient allreduce, all steps (with "nccl": the time to enqueue it)."""
        return self._impl.allreduce_seconds

    @property
    def last_allreduce_seconds(self):
        """The gradient allreduce of the last step."""
        return self._impl.last_allreduce_seconds

    def parameter_divergence(self):
        """Largest |p - p_root| over all parameters and ranks (collective; 0.0 when in sync, NaN when
        any rank holds a parameter that is not finite)."""
        return self._impl.parameter_divergence()

    def __repr__(self):
        return f"DataParallel(rank={self.rank}, size={self.size}, root={self.root}, transport={self.transport!r})"


def _host_setup(trainer):
    """Settings that must agree on every rank and that only Python sees: the optimizer with all its
    hyper-parameters (replacing the C++ description, name and lr), and the learning-rate schedule."""
    trainer.model._compiled()
    if not isinstance(trainer._native, _core.Trainer):
        raise TypeError(f"trainer must be a treadle Trainer, got {type(trainer).__name__}")
    opt = trainer.optimizer
    settings = dict(getattr(opt, "defaults", {}), lr=opt.lr)  # the lr may have been set since
    args = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    return [("optimizer", f"{type(opt).__name__}({args})"), ("schedule", repr(trainer.schedule))]


def _is_rank(root, size):
    return not isinstance(root, bool) and isinstance(root, (int, np.integer)) and 0 <= root < size


def _contiguous(a):
    """A C-contiguous numpy array, or a CUDA array (a model on "cuda" takes it as it is) unchanged."""
    return a if hasattr(a, "__cuda_array_interface__") else np.ascontiguousarray(a)


def _describe(error):
    """The message of an exception (its type too unless a ValueError), or the text given."""
    if isinstance(error, ValueError) or not isinstance(error, BaseException):
        return str(error)
    return f"{type(error).__name__.lstrip('_')}: {error}"  # treadle's _TypeError reads as TypeError
