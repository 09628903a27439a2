"""A host whose MPI is not the one treadle::distributed was built for: this Python's mpi4py initialises its
MPI, then the C API of the treadle installed under LIBDIR (argv[1], built against another MPI) is asked to
train over MPI_COMM_WORLD's Fortran handle. Prints each rank's status and message; the test expects
TREADLE_ERROR_VALUE naming both MPIs on every rank, and no crash or hang."""
import ctypes
import json
import os
import sys

from mpi4py import MPI

MODEL = {"type": "Sequential", "layers": [{"type": "Linear", "config": {"in_features": 3, "out_features": 1}}]}

lib = sys.argv[1]
core = ctypes.CDLL(os.path.join(lib, "libtreadle.so"), mode=ctypes.RTLD_GLOBAL)
distributed = ctypes.CDLL(os.path.join(lib, "libtreadle_distributed.so"))
core.treadle_last_error.restype = ctypes.c_char_p
model, trainer, dp = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert core.treadle_model_from_json(json.dumps(MODEL).encode(), 0, ctypes.c_uint64(0), ctypes.byref(model)) == 0
assert core.treadle_trainer_create(model, b"mse", b"sgd", b'{"lr": 0.1}', ctypes.c_uint64(0), ctypes.byref(trainer)) == 0
rank = MPI.COMM_WORLD.Get_rank()
status = distributed.treadle_data_parallel_create_f(trainer, MPI.COMM_WORLD.py2f(), 0, None, ctypes.byref(dp))
print(f"rank {rank} host MPI {MPI.Get_library_version().splitlines()[0].split(',')[0]!r}: status {status}: "
      f"{core.treadle_last_error().decode()}", flush=True)
core.treadle_trainer_free(trainer)
core.treadle_model_free(model)
