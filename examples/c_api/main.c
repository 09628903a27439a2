/* treadle from C: load a model file (written by Python's tl.save or by treadle_model_save), predict,
 * train it for a few steps, and save it. Also builds a model from a JSON description and shows how
 * errors come back (a status code plus treadle_last_error()).
 *
 *   c_api_example MODEL.safetensors OUT_DIR
 * writes OUT_DIR/predict.bin (the predictions for the input below, raw float32),
 * OUT_DIR/trained.safetensors (after STEPS Adam steps on the batch below) and prints the losses.
 * The inputs are x[i][j] = sin(0.1 * (i * IN + j) + 0.3), targets y[i][k] = cos(0.2 * (i * OUT + k)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <treadle/treadle.h>

#define BATCH 16
#define STEPS 25

#define CHECK(call)                                                                       \
  do {                                                                                    \
    int status_ = (call);                                                                 \
    if (status_ != TREADLE_OK) {                                                          \
      fprintf(stderr, "c_api_example: %s failed (%d): %s\n", #call, status_, treadle_last_error()); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static void write_file(const char* dir, const char* name, const void* data, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, bytes, f) != bytes) {
    fprintf(stderr, "c_api_example: cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

/* Errors are values: a bad description gives TREADLE_ERROR_VALUE and a message naming the problem. */
static void show_error_handling(void) {
  treadle_model* bad = NULL;
  int status = treadle_model_from_json("{\"type\": \"Sequential\", \"layers\": [{\"type\": \"Conv9d\"}]}",
                                       TREADLE_F32, 0, &bad);
  printf("bad description: status %d, message: %s\n", status, treadle_last_error());

  const char* json =
      "{\"type\": \"Sequential\", \"layers\": ["
      "{\"type\": \"Linear\", \"config\": {\"in_features\": 3, \"out_features\": 8}}, {\"type\": \"ReLU\"},"
      "{\"type\": \"Dropout\", \"config\": {\"p\": 0.1}},"
      "{\"type\": \"LayerNorm\", \"config\": {\"normalized_shape\": [8]}},"
      "{\"type\": \"Linear\", \"config\": {\"in_features\": 8, \"out_features\": 2}}]}";
  treadle_model* built = NULL;
  int64_t count = 0;
  CHECK(treadle_model_from_json(json, TREADLE_F64, 1, &built));
  CHECK(treadle_model_num_parameters(built, &count));
  double x[3] = {0.5, -1.0, 2.0}, y[2];
  int64_t shape[2] = {1, 3};
  status = treadle_model_predict(built, x, 2, shape, y, 1); /* room for 1 value, 2 needed */
  printf("json model: %lld parameters; predict into a short buffer: status %d (%s)\n", (long long)count, status,
         treadle_last_error());
  CHECK(treadle_model_predict(built, x, 2, shape, y, 2));
  treadle_model_free(built);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_api_example MODEL.safetensors OUT_DIR\n");
    return 2;
  }
  treadle_model* model = NULL;
  CHECK(treadle_model_load(argv[1], &model));

  treadle_dtype dtype;
  CHECK(treadle_model_dtype(model, &dtype));
  if (dtype != TREADLE_F32) {
    fprintf(stderr, "c_api_example: this example expects a float32 model\n");
    return 1;
  }
  /* The input width from the first layer: ask the model for the output shape of a guess. */
  int64_t in = 0, out_shape[8];
  int out_ndim = 0;
  for (int64_t guess = 1; guess <= 4096 && in == 0; ++guess) {
    int64_t shape[2] = {BATCH, guess};
    if (treadle_model_output_shape(model, 2, shape, 8, &out_ndim, out_shape) == TREADLE_OK) in = guess;
  }
  if (in == 0 || out_ndim != 2) {
    fprintf(stderr, "c_api_example: expected a model from (N, in) to (N, out)\n");
    return 1;
  }
  int64_t out = out_shape[1];
  float* x = malloc(sizeof(float) * BATCH * in);
  float* y = malloc(sizeof(float) * BATCH * out);
  float* pred = malloc(sizeof(float) * BATCH * out);
  for (int64_t i = 0; i < BATCH * in; ++i) x[i] = (float)sin(0.1 * (double)i + 0.3);
  for (int64_t i = 0; i < BATCH * out; ++i) y[i] = (float)cos(0.2 * (double)i);
  int64_t x_shape[2] = {BATCH, in}, y_shape[2] = {BATCH, out};
  printf("model: (N, %lld) -> (N, %lld)\n", (long long)in, (long long)out);

  CHECK(treadle_model_predict(model, x, 2, x_shape, pred, BATCH * out));
  write_file(argv[2], "predict.bin", pred, sizeof(float) * BATCH * out);

  treadle_trainer* trainer = NULL;
  CHECK(treadle_trainer_create(model, "mse", "adam", "{\"lr\": 0.01}", 0, &trainer));
  double loss = 0.0;
  for (int step = 1; step <= STEPS; ++step) {
    CHECK(treadle_trainer_step(trainer, x, 2, x_shape, y, 2, y_shape, &loss));
    if (step == 1 || step == STEPS) printf("step %d loss %.8e\n", step, loss);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/trained.safetensors", argv[2]);
  CHECK(treadle_model_save(model, path));

  show_error_handling();
  treadle_trainer_free(trainer);
  treadle_model_free(model);
  free(x);
  free(y);
  free(pred);
  printf("done\n");
  return 0;
}
