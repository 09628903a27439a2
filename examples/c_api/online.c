/* Online training from a C time loop: the run of examples/fortran/online.f90, written in C. An ensemble of
 * heat-equation runs pushes its samples into a treadle replay buffer between time steps; a surrogate
 * trains on batches sampled from it; halfway the program checkpoints the trainer with the buffer, and at
 * the end a fresh trainer and buffer resume from that checkpoint and must repeat the losses bit for bit.
 *
 *   c_online_example OUT_DIR
 *
 * The simulation: RUNS periodic 1-D heat equations on NX points, u <- u + r ((u[i+1] - 2 u[i]) + u[i-1]),
 * SUBSTEPS explicit steps per coarse step, a diffusion number r in [R_LOW, R_HIGH] per run, restarts after
 * EPISODE coarse steps (staggered). Initial conditions: uniform values in [-1, 1] from a Park-Miller
 * generator, smoothed by SMOOTH steps at r = 1/4. A sample is (state, scaled r) -> SCALE * (change over one
 * coarse step), float32. Prints the losses (17 digits) and the resume check; writes OUT_DIR/online.treadle
 * and OUT_DIR/predict.bin (predictions for the final states, raw float32). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <treadle/treadle.h>

enum { NX = 16, RUNS = 8, SUBSTEPS = 4, EPISODE = 16, SMOOTH = 8 };
enum { STEPS = 2000, CHECKPOINT = 1000, BATCH = 32, CAPACITY = 1024, WATERMARK = 64, SEED = 11 };
static const double R_LOW = 0.05, R_HIGH = 0.45, SCALE = 10.0;
static const char* MODEL_JSON =
    "{\"format\": \"treadle-architecture/1\", \"model\": {\"type\": \"Sequential\", \"layers\": ["
    "{\"type\": \"Linear\", \"config\": {\"in_features\": 17, \"out_features\": 64}}, {\"type\": \"Tanh\"}, "
    "{\"type\": \"Linear\", \"config\": {\"in_features\": 64, \"out_features\": 64}}, {\"type\": \"Tanh\"}, "
    "{\"type\": \"Linear\", \"config\": {\"in_features\": 64, \"out_features\": 16}}]}}";

#define CHECK(call)                                                                                 \
  do {                                                                                              \
    int status_ = (call);                                                                           \
    if (status_ != TREADLE_OK) {                                                                    \
      fprintf(stderr, "c_online_example: %s failed (%d): %s\n", #call, status_, treadle_last_error()); \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

/* The ensemble's whole state: what the host keeps next to treadle's checkpoint. */
typedef struct {
  double u[RUNS][NX], r[RUNS];
  int age[RUNS];
  int64_t draws;
} ensemble;

typedef struct {
  treadle_model* model;
  treadle_trainer* trainer;
  treadle_replay* buffer;
} learner;

/* Park-Miller's minimal standard generator: the next draw in (0, 1). */
static double uniform(int64_t* draws) {
  *draws = 16807 * *draws % 2147483647;
  return (double)*draws / 2147483647.0;
}

/* `steps` explicit steps of the periodic heat equation with diffusion number r. */
static void diffuse(double* u, double r, int steps) {
  double old[NX];
  for (int step = 0; step < steps; ++step) {
    memcpy(old, u, sizeof old);
    for (int i = 0; i < NX; ++i) u[i] = old[i] + r * ((old[(i + 1) % NX] - 2.0 * old[i]) + old[(i + NX - 1) % NX]);
  }
}

/* New initial conditions (NX draws, then r) for the runs whose age reached `age_limit`, in run order. */
static void restart_runs(ensemble* sim, int age_limit) {
  for (int j = 0; j < RUNS; ++j) {
    if (sim->age[j] < age_limit) continue;
    for (int i = 0; i < NX; ++i) sim->u[j][i] = 2.0 * uniform(&sim->draws) - 1.0;
    diffuse(sim->u[j], 0.25, SMOOTH);
    sim->r[j] = R_LOW + (R_HIGH - R_LOW) * uniform(&sim->draws);
    sim->age[j] = 0;
  }
}

/* The network's inputs, (RUNS, NX + 1) row-major: each run's state and its r scaled to [-1, 1]. */
static void features(const ensemble* sim, float x[RUNS][NX + 1]) {
  for (int j = 0; j < RUNS; ++j) {
    for (int i = 0; i < NX; ++i) x[j][i] = (float)sim->u[j][i];
    x[j][NX] = (float)(2.0 * (sim->r[j] - R_LOW) / (R_HIGH - R_LOW) - 1.0);
  }
}

static learner start(void) {
  learner l = {NULL, NULL, NULL};
  const char* names[2] = {"x", "y"};
  const int ndims[2] = {1, 1};
  const int64_t shapes[2] = {NX + 1, NX};
  const treadle_dtype dtypes[2] = {TREADLE_F32, TREADLE_F32};
  CHECK(treadle_model_from_json(MODEL_JSON, TREADLE_F32, SEED, &l.model));
  CHECK(treadle_trainer_create(l.model, "mse", "adam", "{\"lr\": 0.003}", SEED, &l.trainer));
  CHECK(treadle_replay_create("firo", CAPACITY, WATERMARK, 0, SEED, 2, names, ndims, shapes, dtypes, &l.buffer));
  return l;
}

static void finish(learner* l) {
  treadle_replay_free(l->buffer);
  treadle_trainer_free(l->trainer);
  treadle_model_free(l->model);
}

/* Coarse steps first..last of the host's time loop: the simulation's step, its samples pushed, one
 * training step on a sampled batch once the buffer holds its watermark, restarts of old runs. The
 * uninterrupted run records the losses and checkpoints after step CHECKPOINT; a resumed run compares. */
static void run(learner* l, ensemble* sim, int first, int last, double* losses, int uninterrupted,
                const char* checkpoint, ensemble* at_checkpoint) {
  static float x[RUNS][NX + 1], y[RUNS][NX], bx[BATCH][NX + 1], by[BATCH][NX];
  const int64_t bx_shape[2] = {BATCH, NX + 1}, by_shape[2] = {BATCH, NX};
  for (int step = first; step <= last; ++step) {
    ensemble next = *sim;
    for (int j = 0; j < RUNS; ++j) diffuse(next.u[j], sim->r[j], SUBSTEPS);
    features(sim, x);
    for (int j = 0; j < RUNS; ++j)
      for (int i = 0; i < NX; ++i) y[j][i] = (float)((next.u[j][i] - sim->u[j][i]) * SCALE);
    const void* pushed[2] = {x, y};
    CHECK(treadle_replay_push(l->buffer, RUNS, pushed));
    double loss = -1.0;
    int ready = 0;
    CHECK(treadle_replay_ready(l->buffer, BATCH, &ready));
    if (ready) {
      void* batch[2] = {bx, by};
      CHECK(treadle_replay_sample(l->buffer, BATCH, batch));
      CHECK(treadle_trainer_step(l->trainer, bx, 2, bx_shape, by, 2, by_shape, &loss));
    }
    if (uninterrupted) {
      losses[step - 1] = loss;
      if (step % 250 == 0) printf("step %d loss %.16e\n", step, loss);
    } else if (loss != losses[step - 1]) {
      fprintf(stderr, "c_online_example: resumed step %d loss %.16e differs from %.16e\n", step, loss,
              losses[step - 1]);
      exit(1);
    }
    *sim = next;
    for (int j = 0; j < RUNS; ++j) sim->age[j] += 1;
    restart_runs(sim, EPISODE);
    if (uninterrupted && step == CHECKPOINT) {
      const char* names[1] = {"replay"};
      CHECK(treadle_trainer_save_checkpoint(l->trainer, checkpoint, 1, names, &l->buffer));
      *at_checkpoint = *sim;
    }
  }
}

static void predict(learner* l, const ensemble* sim, float out[RUNS][NX]) {
  static float x[RUNS][NX + 1];
  const int64_t shape[2] = {RUNS, NX + 1};
  features(sim, x);
  CHECK(treadle_model_predict(l->model, x, 2, shape, out, RUNS * NX));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_online_example OUT_DIR\n");
    return 2;
  }
  static double losses[STEPS];
  static float pred[RUNS][NX], pred_resumed[RUNS][NX];
  char checkpoint[4096], predictions[4096];
  snprintf(checkpoint, sizeof checkpoint, "%s/online.treadle", argv[1]);
  snprintf(predictions, sizeof predictions, "%s/predict.bin", argv[1]);

  ensemble sim, at_checkpoint;
  memset(&sim, 0, sizeof sim);
  sim.draws = SEED;
  for (int j = 0; j < RUNS; ++j) sim.age[j] = EPISODE;  /* every run starts fresh, */
  restart_runs(&sim, EPISODE);
  for (int j = 0; j < RUNS; ++j) sim.age[j] = 3 * j % EPISODE;  /* then restarts are staggered */

  learner l = start();
  run(&l, &sim, 1, STEPS, losses, 1, checkpoint, &at_checkpoint);
  predict(&l, &sim, pred);
  FILE* f = fopen(predictions, "wb");
  if (!f || fwrite(pred, sizeof pred, 1, f) != 1) {
    fprintf(stderr, "c_online_example: cannot write %s\n", predictions);
    return 1;
  }
  fclose(f);
  finish(&l);

  /* A new process would do this: fresh objects, the checkpoint loaded, the host's own state restored. */
  l = start();
  const char* names[1] = {"replay"};
  CHECK(treadle_trainer_load_checkpoint(l.trainer, checkpoint, 1, names, &l.buffer));
  sim = at_checkpoint;
  run(&l, &sim, CHECKPOINT + 1, STEPS, losses, 0, NULL, NULL);
  predict(&l, &sim, pred_resumed);
  if (memcmp(pred, pred_resumed, sizeof pred) != 0) {
    fprintf(stderr, "c_online_example: the resumed run predicts differently\n");
    return 1;
  }
  printf("resumed run equals the uninterrupted one bit for bit\n");
  finish(&l);
  printf("done\n");
  return 0;
}
