/* Data-parallel training from a C MPI program (treadle/treadle_distributed.h). The same run as
 * data_parallel.f90 and data_parallel.py in this directory, bit for bit:
 *
 *   mpiexec -n 3 ./c_data_parallel OUT_DIR
 *
 * The host owns MPI: it initialises it, splits MPI_COMM_WORLD into groups of two ranks (ranks 0-1,
 * 2-3, ...; a last odd rank is a group of one) and lends each group's communicator to treadle, which
 * trains one model per group. Every rank builds the same data set (a Park-Miller generator: integer
 * arithmetic, the same numbers in any language): N samples x in [-2, 2]^3, y = x0 x1 - x2^2 / 2 + x0 / 4.
 * Step s trains on the global batch of rows (s B + k) mod N, k = 0..B-1, split over the group's ranks in
 * order (the first B mod size ranks take one row more). The group's rank 0 prints its losses (17 digits)
 * and writes its final parameters to OUT_DIR/params_group<G>.bin (raw float32). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <treadle/treadle.h>
#include <treadle/treadle_distributed.h>

enum { N = 256, FEATURES = 3, B = 24, STEPS = 60, SEED = 3 };
static const char* MODEL_JSON =
    "{\"format\": \"treadle-architecture/1\", \"model\": {\"type\": \"Sequential\", \"layers\": ["
    "{\"type\": \"Linear\", \"config\": {\"in_features\": 3, \"out_features\": 32}}, {\"type\": \"Tanh\"}, "
    "{\"type\": \"Linear\", \"config\": {\"in_features\": 32, \"out_features\": 32}}, {\"type\": \"Tanh\"}, "
    "{\"type\": \"Linear\", \"config\": {\"in_features\": 32, \"out_features\": 1}}]}}";

/* A failed call ends the whole job: the other ranks of a collective that failed here got the same
 * status and message, but ranks of other groups would wait at the final barrier. */
#define CHECK(call)                                                                                      \
  do {                                                                                                   \
    int status_ = (call);                                                                                \
    if (status_ != TREADLE_OK) {                                                                         \
      fprintf(stderr, "c_data_parallel: %s failed (%d): %s\n", #call, status_, treadle_last_error());    \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                      \
    }                                                                                                    \
  } while (0)

static double uniform(int64_t* draws) { /* Park-Miller's minimal standard generator, in (0, 1) */
  *draws = 16807 * *draws % 2147483647;
  return (double)*draws / 2147483647.0;
}

static void make_data(float x[N][FEATURES], float y[N][1]) {
  int64_t draws = 12345;
  for (int i = 0; i < N; ++i) {
    double v[FEATURES];
    for (int j = 0; j < FEATURES; ++j) {
      v[j] = 4.0 * uniform(&draws) - 2.0;
      x[i][j] = (float)v[j];
    }
    y[i][0] = (float)(v[0] * v[1] - v[2] * v[2] / 2.0 + v[0] / 4.0);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (argc != 2) {
    if (world_rank == 0) fprintf(stderr, "usage: c_data_parallel OUT_DIR\n");
    MPI_Finalize();
    return 2;
  }
  const int group = world_rank / 2;
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, group, world_rank, &comm);

  static float x[N][FEATURES], y[N][1], xs[B][FEATURES], ys[B][1];
  make_data(x, y);
  treadle_model* model = NULL;
  treadle_trainer* trainer = NULL;
  treadle_data_parallel* dp = NULL;
  CHECK(treadle_model_from_json(MODEL_JSON, TREADLE_F32, SEED, &model));
  CHECK(treadle_trainer_create(model, "mse", "adam", "{\"lr\": 0.01}", SEED, &trainer));
  CHECK(treadle_data_parallel_create(trainer, comm, 0, NULL, &dp));
  /* A rank that leaves early would leave the others waiting forever in their next step: with a timeout
   * their step returns TREADLE_ERROR_TIMEOUT instead, and CHECK ends the job. */
  CHECK(treadle_data_parallel_set_timeout(dp, 600.0));
  int rank = 0, size = 1;
  CHECK(treadle_data_parallel_rank(dp, &rank, &size));

  /* This rank's rows of each global batch. */
  const int count = B / size + (rank < B % size ? 1 : 0);
  const int first = rank * (B / size) + (rank < B % size ? rank : B % size);
  for (int step = 0; step < STEPS; ++step) {
    for (int k = 0; k < count; ++k) {
      const int row = (step * B + first + k) % N;
      for (int j = 0; j < FEATURES; ++j) xs[k][j] = x[row][j];
      ys[k][0] = y[row][0];
    }
    const int64_t x_shape[2] = {count, FEATURES}, y_shape[2] = {count, 1};
    double loss = 0.0;
    CHECK(treadle_data_parallel_step(dp, xs, 2, x_shape, ys, 2, y_shape, &loss));
    if (rank == 0 && (step + 1) % 10 == 0) printf("group %d step %d loss %.16e\n", group, step + 1, loss);
  }
  double divergence = -1.0;
  CHECK(treadle_data_parallel_divergence(dp, &divergence));
  int64_t n = 0;
  CHECK(treadle_model_num_parameters(model, &n));
  float* params = malloc(sizeof(float) * (size_t)n);
  CHECK(treadle_model_get_parameters(model, params, n));
  if (rank == 0) {
    char path[4096];
    snprintf(path, sizeof path, "%s/params_group%d.bin", argv[1], group);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(params, sizeof(float), (size_t)n, f) != (size_t)n) {
      fprintf(stderr, "c_data_parallel: cannot write %s\n", path);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fclose(f);
    printf("group %d of %d ranks: replicas differ by %g\n", group, size, divergence);
  }
  free(params);
  treadle_data_parallel_free(dp);
  treadle_trainer_free(trainer);
  treadle_model_free(model);
  MPI_Comm_free(&comm);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
