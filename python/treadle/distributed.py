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

With the optional extension treadle._distributed (a build with -DTREADLE_WITH_MPI=ON; with
-DTREADLE_WITH_NCCL=ON for NCCL) the same class can run on the C++ treadle::DataParallel instead,
which is how a model on backend "cuda" allreduces its gradients on the device (transport="nccl").
"""
import hashlib
import time

import numpy as np

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
    """treadle._distributed (the bound C++ DataParallel), or None where it was not built."""
    try:
        from . import _distributed
    except ImportError as e:
        _native_module.error = e
        return None
    return _distributed


def _implementation_wish(trainer, transport, native):
    """What this rank asks for: "native" (the C++ class), "python" (this module), or "auto" (the C++
    class with NCCL if every rank can have it). Raises ValueError where the request cannot be met."""
    if native is False:
        if transport == "nccl":
            raise ValueError("transport 'nccl' needs the C++ treadle::DataParallel, but native=False asks for "
                             "the mpi4py implementation; use transport 'mpi'")
        return "python"
    if native is None and transport == "mpi":
        return "python"
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
        if backend != "cuda":  # the C++ class would refuse it too; this says it in this module's words
            where = f"'{backend}'" if backend else "automatic host dispatch"
            raise ValueError("transport 'nccl' is not available from Python: the NCCL transport of "
                             "the C++ treadle::DataParallel needs the model on backend 'cuda', but its backend is "
                             f"{where}: set the model's backend to 'cuda' first, or use transport 'mpi'")
        return "native"
    capable = module is not None and module.has_nccl and trainer.model._compiled().backend == "cuda"
    return "auto" if capable else "python"


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

    ``transport``: how the gradient buffer travels. "mpi": through host memory with mpi4py (a model on
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

    ``native``: which implementation runs. None (default): the C++ class for "nccl" and where "auto"
    chooses it as above, this module's mpi4py code otherwise. True: the C++ class whatever the
    transport (e.g. "mpi" through C++; ValueError without the extension). False: this module's code
    ("nccl" is then refused). Both give the same results, errors and attributes; every rank must
    make the same choice (else the same ValueError on every rank).
    """

    BUFFER_MODES = ("root", "average", "local")
    TRANSPORTS = ("auto", "mpi", "nccl")

    def __init__(self, trainer, comm, root=0, buffers="root", transport="auto", native=None, timeout=None):
        MPI = _mpi()
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"DataParallel: comm must be an mpi4py communicator, got {type(comm).__name__}")
        if comm == MPI.COMM_NULL:
            raise ValueError("DataParallel: comm is MPI.COMM_NULL (this rank is not in the group)")
        if comm.Is_inter():
            raise ValueError("DataParallel: comm must be an intra-communicator")
        self._mpi, self.comm, self.trainer = MPI, comm, trainer
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._native = None  # the bound C++ DataParallel, when it runs
        # Each rank checks its own arguments, then all agree, so one bad rank never hangs the others.
        error, items, wish = None, None, None
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            error = f"root must be a rank in [0, {self.size}), got {root!r}"
        elif buffers not in self.BUFFER_MODES:
            error = f"buffers must be one of {self.BUFFER_MODES}, got {buffers!r}"
        elif transport not in self.TRANSPORTS:
            error = f"transport must be one of {self.TRANSPORTS}, got {transport!r}"
        elif native not in (None, True, False):
            error = f"native must be None, True or False, got {native!r}"
        elif timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.number))
                                      or not 0 < timeout < float("inf")):
            error = f"timeout must be a positive number of seconds or None, got {timeout!r}"
        else:
            try:
                items = self._setup_items()
                wish = _implementation_wish(trainer, transport, native)
            except Exception as e:  # e.g. not a treadle Trainer, or transport 'nccl' unavailable
                error = e
        self._agree(error, "DataParallel")
        # "auto" takes the C++ class only where every rank can (one small allgather at construction).
        wishes = comm.allgather(wish)
        use_native = wish == "native" or (wish == "auto" and all(w in ("native", "auto") for w in wishes))
        self.root, self.buffers = int(root), buffers
        self.timeout = None if timeout is None else float(timeout)
        self._broken = None    # why this object can no longer be used (a collective left pending by a timeout)
        self._pending = None   # that collective's request and buffer, kept alive
        if use_native:
            items += [("buffers", buffers), ("implementation", "treadle._distributed"), ("transport", transport)]
        else:
            items += [("buffers", buffers), ("implementation", "python"), ("transport", "mpi")]
        self._check_same_setup(items)
        self._buffer_index = self._non_trained_index()
        self._steps = 0
        self.wait_seconds = 0.0            # in the small allreduce (count, loss, flag): waiting for the slowest rank
        self.allreduce_seconds = 0.0       # in the gradient allreduce: moving the gradient buffer
        self.last_allreduce_seconds = 0.0  # the gradient allreduce of the last step
        if use_native:
            # Collective: the C++ setup check (passes: the same settings were compared above), the
            # state broadcast and, for "nccl", the NCCL communicator.
            self._native = _native_module().DataParallel(trainer._native, comm, self.root, buffers, transport,
                                                         self.timeout or 0.0)
            self.transport = self._native.transport
        else:
            self.transport = "mpi"
            self.broadcast_state()

    # -- setup ------------------------------------------------------------------------------------
    def _setup_items(self):
        """(what, value) pairs that must agree on every rank, parameters first."""
        model = self.trainer.model._compiled()
        items = [(f"parameter '{name}' shape", tuple(shape)) for name, shape, _offset in model.layout]
        items.append(("parameter names", tuple(name for name, _s, _o in model.layout)))
        items.append(("parameter count", int(self.trainer.model.flat_parameters().size)))
        items.append(("dtype", model.dtype))
        items.append(("loss", self.trainer.loss.key()))
        opt = self.trainer.optimizer
        settings = dict(getattr(opt, "defaults", {}), lr=opt.lr)  # the lr may have been set since
        args = ", ".join(f"{k}={v!r}" for k, v in settings.items())
        items.append(("optimizer", f"{type(opt).__name__}({args})"))
        items.append(("optimizer state", tuple((k, v.size) for k, v in sorted(opt.state().items()))))
        items.append(("schedule", repr(self.trainer.schedule)))
        items.append(("clip_grad_norm", self.trainer._native.clip_grad_norm))
        # guards that decide whether an update happens: a rank that skips while another applies diverges
        for guard in ("check_finite", "skip_nonfinite", "verify_parameters"):
            items.append((guard, bool(getattr(self.trainer._native, guard))))
        s = self.trainer._native.loss_scaling
        items.append(("loss scaling", (s.mode, s.init_scale, s.growth_factor, s.backoff_factor, s.growth_interval)))
        return items

    def _non_trained_index(self):
        """Flat-buffer indices of the parameters with requires_grad=False (None if there are none)."""
        frozen = {name for name, p in self.trainer.model.named_parameter_objects() if not p.requires_grad}
        spans = [np.arange(offset, offset + int(np.prod(shape, dtype=np.int64)))
                 for name, shape, offset in self.trainer.model._compiled().layout if name in frozen]
        return np.concatenate(spans) if spans else None

    def sync_buffers(self):
        """Makes the non-trained state (BatchNorm running statistics) agree per ``buffers`` (collective).

        ``step`` and ``allreduce_gradients`` call it; it is public for hosts that change that state
        themselves. Does nothing (and communicates nothing) when the model has no such state or
        ``buffers="local"``.
        """
        if self._native is not None:
            return self._native.sync_buffers()
        if self._buffer_index is None or self.buffers == "local":
            return
        params = self.trainer.model.flat_parameters()
        packed = params[self._buffer_index]
        if self.buffers == "root":
            self.comm.Bcast(packed, root=self.root)
        else:
            self.comm.Allreduce(self._mpi.IN_PLACE, packed, op=self._mpi.SUM)
            packed /= self.size
        params[self._buffer_index] = packed

    def _check_same_setup(self, items):
        digest = hashlib.sha256(repr(items).encode()).hexdigest()
        seen = self.comm.allgather((self.root, digest))
        roots = [r for r, _d in seen]
        if any(r != roots[0] for r in roots):
            bad = next(i for i, r in enumerate(roots) if r != roots[0])
            raise ValueError(f"DataParallel: root is {roots[bad]} on rank {bad} but {roots[0]} on rank 0")
        digests = [d for _r, d in seen]
        if all(d == digests[self.root] for d in digests):
            return
        # Rare path, taken by every rank since all see the same digests: exchange the full lists so
        # that each rank names the same first difference.
        everyone = self.comm.allgather(items)
        bad = next(r for r, d in enumerate(digests) if d != digests[self.root])
        raise ValueError("DataParallel: " + _first_difference(everyone[self.root], self.root, everyone[bad], bad))

    def broadcast_state(self):
        """Copies root's parameters, optimizer state and step count to every rank (collective)."""
        if self._native is not None:
            return self._native.broadcast_state()
        comm, root = self.comm, self.root
        comm.Bcast(self.trainer.model.flat_parameters(), root=root)
        opt = self.trainer.optimizer
        state = opt.state()
        for name in sorted(state):
            comm.Bcast(state[name], root=root)
        step_count = comm.bcast(opt.step_count, root=root)
        opt.load_state(state, step_count)
        # The dynamic loss scale: every rank then takes the same skip decisions on the summed gradients.
        native = self.trainer._native
        scale, tracker = comm.bcast((native.loss_scale, native.loss_scale_growth_tracker), root=root)
        native.set_loss_scale_state(scale, tracker)

    # -- stepping ---------------------------------------------------------------------------------
    def step(self, x, y):
        """One data-parallel training step on this rank's shard; returns the global mean loss.

        Shards may differ in size (even be empty on some ranks): the gradient is that of the loss over
        the global batch. If any rank fails (bad input, an error in the model), no rank updates and
        every rank raises ValueError("DataParallel.step: rank R failed: ...").
        """
        self._check_usable("DataParallel.step")
        trainer = self.trainer
        trainer.zero_grad()
        # A failed step must change nothing, but the forward pass on the ranks that did not fail has
        # already updated their running statistics: keep a copy to put back.
        saved = None if self._buffer_index is None else trainer.model.flat_parameters()[self._buffer_index]
        count, loss, error = 0, 0.0, None
        try:
            x, y = _contiguous(x), _contiguous(y)
            count = _local_count(x, y)
            if count:
                loss = trainer.compute_gradients(x, y)
        except Exception as e:  # reported to every rank below, then re-raised everywhere
            error = e
        try:
            result = self._reduce(count, loss, error, "DataParallel.step")
        except ValueError:
            if saved is not None:
                trainer.model.flat_parameters()[self._buffer_index] = saved
            raise
        trainer.update()
        return result

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
        return self._reduce(count, loss, error, "DataParallel.allreduce_gradients")

    @property
    def steps(self):
        """Data-parallel steps taken (successful gradient allreduces)."""
        return self._steps if self._native is None else self._native.steps

    def _check_usable(self, where):
        if self._broken:
            raise TimeoutError(f"{where}: this DataParallel cannot be used again: {self._broken}")

    def _allreduce_head(self, head, where):
        """The step's first collective (count, loss, error flag), where a rank that left early is missed:
        with a timeout it is posted non-blocking and tested until every rank arrived or the time is up
        (sleeping up to 1 ms between tests, so a long wait leaves the core to others)."""
        self._check_usable(where)
        MPI = self._mpi
        if self.timeout is None:
            self.comm.Allreduce(MPI.IN_PLACE, head, op=MPI.SUM)
            return
        request = self.comm.Iallreduce(MPI.IN_PLACE, head, op=MPI.SUM)
        deadline, pause = time.perf_counter() + self.timeout, 1e-5
        while not request.Test():
            if time.perf_counter() > deadline:
                self._pending = (request, head)
                self._broken = (f"{where}: not every rank of the communicator arrived within the timeout of "
                                f"{self.timeout:g} s (a rank left early, failed outside treadle, or is still busy); "
                                "the collective stays pending, so abort the job (comm.Abort)")
                raise TimeoutError(self._broken)
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def _reduce(self, count, loss, error, where):
        comm, MPI = self.comm, self._mpi
        mean = self.trainer.loss.reduction == "mean"
        if error is None and (isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0):
            error = f"count must be a non-negative integer, got {count!r}"
        if self._native is not None:
            return self._reduce_native(count, loss, error, where)
        # One small allreduce carries the count, the loss and the error flag. With reduction="mean"
        # the global loss is sum(count_r * loss_r) / sum(count_r); with "sum" it is sum(loss_r).
        head = np.zeros(3)
        if error is not None:
            head[2] = 1.0
        elif count:
            head[0], head[1] = count, float(loss) * count if mean else float(loss)
        start = time.perf_counter()
        self._allreduce_head(head, where)
        self.wait_seconds += time.perf_counter() - start
        total, loss_total, failures = head
        if failures:
            self._raise_failure(error, where)
        if total <= 0:
            raise ValueError(f"{where}: the global batch is empty (every rank passed count 0)")
        grads = self.trainer.model.flat_gradients()
        if mean and count != total:
            grads *= grads.dtype.type(count / total)
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)
        self.last_allreduce_seconds = time.perf_counter() - start
        self.allreduce_seconds += self.last_allreduce_seconds
        self.sync_buffers()
        self._steps += 1
        return loss_total / total if mean else loss_total

    def _reduce_native(self, count, loss, error, where):
        """_reduce through the C++ class: the same exchange, the same errors (its messages name the
        C++ member; they are given this class's names)."""
        if error is None:
            try:
                loss = float(loss)
            except Exception as e:  # reported to every rank like any other failure
                error = e
        message = "" if error is None else (_describe(error) or type(error).__name__)
        seconds = self._native.allreduce_seconds
        start = time.perf_counter()
        try:
            result = self._native.allreduce_gradients(int(count) if error is None else 0,
                                                      loss if error is None else 0.0, message)
        except ValueError as e:
            text = str(e).replace("DataParallel::allreduce_gradients", where, 1)
            raise ValueError(text) from (error if isinstance(error, BaseException) else None)
        except TimeoutError as e:
            raise TimeoutError(str(e).replace("DataParallel::allreduce_gradients", where)) from None
        elapsed = time.perf_counter() - start
        self.last_allreduce_seconds = self._native.allreduce_seconds - seconds
        self.allreduce_seconds += self.last_allreduce_seconds
        self.wait_seconds += max(0.0, elapsed - self.last_allreduce_seconds)
        return result

    # -- checks -----------------------------------------------------------------------------------
    def parameter_divergence(self):
        """Largest |p - p_root| over all parameters and ranks (collective; 0.0 when in sync, NaN when
        any rank holds a parameter that is not finite)."""
        if self._native is not None:
            return self._native.parameter_divergence()
        params = self.trainer.model.flat_parameters()
        ref = params.copy()
        self.comm.Bcast(ref, root=self.root)
        diff = np.abs(params.astype(np.float64) - ref)
        finite = np.isfinite(diff)
        # MPI's MAX over a NaN is implementation-defined: the NaN travels as a flag
        local = np.array([float(diff[finite].max()) if finite.any() else 0.0, 0.0 if finite.all() else 1.0])
        self.comm.Allreduce(self._mpi.IN_PLACE, local, op=self._mpi.MAX)
        return float("nan") if local[1] else float(local[0])

    def _agree(self, error, where):
        """Collective: raises the same ValueError on every rank if any rank passes an error."""
        flag = np.array([0.0 if error is None else 1.0])
        self.comm.Allreduce(self._mpi.IN_PLACE, flag, op=self._mpi.SUM)
        if flag[0]:
            self._raise_failure(error, where)

    def _raise_failure(self, error, where):
        messages = self.comm.allgather(None if error is None else _describe(error))
        failed = [r for r, m in enumerate(messages) if m is not None]
        first = failed[0]
        more = f" (and {len(failed) - 1} more rank{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
        text = f"{where}: rank {first} failed{more}: {messages[first]}"
        if isinstance(error, BaseException):
            raise ValueError(text) from error
        raise ValueError(text)

    def __repr__(self):
        return f"DataParallel(rank={self.rank}, size={self.size}, root={self.root}, transport={self.transport!r})"


def _contiguous(a):
    """A C-contiguous numpy array, or a CUDA array (a model on "cuda" takes it as it is) unchanged."""
    return a if hasattr(a, "__cuda_array_interface__") else np.ascontiguousarray(a)


def _local_count(x, y):
    """Terms in this shard's mean loss: target elements (samples x per-sample size)."""
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"x and y need a batch dimension, got shapes {x.shape} and {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
    return int(y.size)


def _describe(error):
    """The message of an exception (its type too unless a ValueError), or the text given."""
    if isinstance(error, ValueError) or not isinstance(error, BaseException):
        return str(error)
    return f"{type(error).__name__.lstrip('_')}: {error}"  # treadle's _TypeError reads as TypeError


def _first_difference(ref, ref_rank, other, rank):
    """A sentence naming the first setting in which rank `rank` differs from the root."""
    ref_map, other_map = dict(ref), dict(other)
    ref_names, names = ref_map["parameter names"], other_map["parameter names"]
    for i in range(max(len(ref_names), len(names))):
        mine = names[i] if i < len(names) else None
        theirs = ref_names[i] if i < len(ref_names) else None
        if mine == theirs:
            continue
        if theirs is not None and theirs not in names:
            return f"rank {rank} lacks parameter '{theirs}' of root rank {ref_rank}"
        if mine is not None and mine not in ref_names:
            return f"rank {rank} has parameter '{mine}' that root rank {ref_rank} lacks"
        return f"parameter #{i} is '{mine}' on rank {rank} but '{theirs}' on root rank {ref_rank}"
    for what, value in other:
        if ref_map[what] != value:
            return f"{what} is {value} on rank {rank} but {ref_map[what]} on root rank {ref_rank}"
    return f"rank {rank} differs from root rank {ref_rank}"  # unreachable while the digests come from `items`
