/* treadle's C API for data-parallel training over the host's MPI communicator (library
 * treadle::distributed, built with -DTREADLE_WITH_MPI=ON; link libtreadle_distributed and the MPI the
 * host uses). The semantics are treadle::DataParallel's (treadle/distributed.hpp, docs/distributed.md):
 * every call below except free is collective over the communicator, all of its ranks call it in the
 * same order, and an error on any rank (bad input, a model error) is reported on every rank with the
 * same message, so no rank waits for another that gave up. treadle never initialises MPI.
 *
 * A communicator comes as the host holds it: an MPI_Comm from C, or from Fortran an INTEGER handle
 * (MPI_Fint: `use mpi`'s communicators, or comm%MPI_VAL of mpi_f08's TYPE(MPI_Comm)), converted with
 * MPI_Comm_f2c. The MPI library must be the implementation this library was built for (MPICH's ABI,
 * or Open MPI): another one is refused with TREADLE_ERROR_VALUE and a message naming both. */
#ifndef TREADLE_DISTRIBUTED_H
#define TREADLE_DISTRIBUTED_H

#include <mpi.h>

#include "treadle/treadle.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct treadle_data_parallel treadle_data_parallel;

/* Collective. Checks that every rank's trainer has the same parameter layout, dtype, loss and optimizer
 * (else TREADLE_ERROR_VALUE on every rank, naming the first difference), then copies root's parameters,
 * optimizer state and step count to every rank. buffers: what happens to non-trained state such as
 * BatchNorm's running statistics after each step, "root" (NULL: every rank takes root's), "average" or
 * "local". The trainer and the communicator must outlive the handle; the communicator is borrowed
 * (never duplicated or freed). */
TREADLE_C_API int treadle_data_parallel_create(treadle_trainer* trainer, MPI_Comm comm, int root, const char* buffers,
                                               treadle_data_parallel** out);
/* The same with a Fortran communicator handle. */
TREADLE_C_API int treadle_data_parallel_create_f(treadle_trainer* trainer, MPI_Fint comm, int root,
                                                 const char* buffers, treadle_data_parallel** out);
TREADLE_C_API void treadle_data_parallel_free(treadle_data_parallel* dp); /* NULL is fine; not collective */

/* Collective: one training step on this rank's shard (x, y as treadle_trainer_step takes them; shards may
 * differ in size or be empty, with y of shape (0, ...)). The gradients of the global mean loss are
 * summed over the ranks and every rank applies the same update; *loss (may be NULL) is the global loss.
 * On any rank's error no rank updates. */
TREADLE_C_API int treadle_data_parallel_step(treadle_data_parallel* dp, const void* x, int x_ndim,
                                             const int64_t* x_shape, const void* y, int y_ndim,
                                             const int64_t* y_shape, double* loss);
/* Collective with the other ranks' treadle_data_parallel_step: this rank takes part as one that failed
 * with `error` (a check of the host's own: a simulation that diverged, arrays it could not build), so every
 * rank's step returns TREADLE_ERROR_VALUE with the same message naming this rank, and nothing changes.
 * Returns that status here too. */
TREADLE_C_API int treadle_data_parallel_fail(treadle_data_parallel* dp, const char* error);
/* Seconds each following step waits in its first collective for every rank to arrive (0, the default:
 * as long as MPI waits, which is forever for a rank that left early). Where not every rank arrives in
 * time, the step returns TREADLE_ERROR_TIMEOUT on the ranks that did; a collective then stays pending, so
 * the handle refuses every later step and the host should end the job (MPI_Abort). Not collective. */
TREADLE_C_API int treadle_data_parallel_set_timeout(treadle_data_parallel* dp, double seconds);
/* Collective: the largest |p - p_root| over all parameters and ranks (0 when the replicas agree). */
TREADLE_C_API int treadle_data_parallel_divergence(treadle_data_parallel* dp, double* divergence);
/* This rank and the communicator's size. */
TREADLE_C_API int treadle_data_parallel_rank(const treadle_data_parallel* dp, int* rank, int* size);

#ifdef __cplusplus
}
#endif

#endif /* TREADLE_DISTRIBUTED_H */
