/* treadle's C API: models and training from C, Fortran (ISO_C_BINDING) or any language with a C FFI.
 *
 * Handles are opaque. Every function returns a treadle_status (TREADLE_OK = 0); on an error,
 * treadle_last_error() returns the message (thread-local: valid until this thread's next call).
 * No function throws, aborts or starts a thread. Buffers are caller-owned, contiguous (C order),
 * and hold the model's dtype (float for TREADLE_F32 models, double for TREADLE_F64) unless said
 * otherwise; shapes are int64 arrays of length ndim.
 *
 * Model descriptions are JSON, the format tl.save writes ("treadle-architecture/1"):
 *   {"format": "treadle-architecture/1", "model": {"type": "Sequential", "layers": [
 *      {"type": "Linear", "config": {"in_features": 4, "out_features": 16}}, {"type": "Tanh"},
 *      {"type": "Linear", "config": {"in_features": 16, "out_features": 1}}]}}
 * (the bare "model" node is accepted too), with the torch.nn constructor arguments as "config"; the
 * format's one reader is treadle/architecture.hpp (layer types, keys, defaults, checks), shared with
 * Python's tl.load. Built here: Sequential, Linear, the activations, Dropout, Flatten, Identity,
 * LayerNorm, RMSNorm, GroupNorm, BatchNorm1d/2d/3d, Embedding, Unflatten, OutputTransform,
 * Conv1d/2d/3d (padding_mode "zeros"), ConvTranspose1d/2d/3d, MaxPool (without return_indices),
 * AvgPool, AdaptiveAvgPool, GlobalAvgPool2d, RNN, GRU, LSTM, MultiheadAttention and
 * TransformerEncoderLayer. Layers that only the Python package composes (ProjectedLSTM, MaxUnpool,
 * TransformerDecoderLayer, Transformer, other padding modes) are refused by name.
 */
#ifndef TREADLE_TREADLE_H
#define TREADLE_TREADLE_H

#include <stdint.h>

#if defined(_WIN32)
#define TREADLE_C_API
#else
#define TREADLE_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum treadle_status {
  TREADLE_OK = 0,
  TREADLE_ERROR_VALUE = 1,    /* bad value or shape (treadle::ValueError) */
  TREADLE_ERROR_TYPE = 2,     /* bad dtype (treadle::TypeError) */
  TREADLE_ERROR_IO = 3,       /* file system error */
  TREADLE_ERROR_ARGUMENT = 4, /* null handle or pointer, bad ndim, buffer too small */
  TREADLE_ERROR_MEMORY = 5,   /* out of memory */
  TREADLE_ERROR_INTERNAL = 6, /* anything else */
  TREADLE_ERROR_TIMEOUT = 7   /* other processes did not arrive in time (treadle_data_parallel_set_timeout) */
} treadle_status;

/* The last enumerator widens the type to every int value, so that a caller's wrong value (a C int
 * passed through an FFI) is a defined value the API can refuse, not undefined behaviour in C++. */
/* Models are TREADLE_F32 or TREADLE_F64; replay buffer fields may also be integers (labels, ids). */
typedef enum treadle_dtype {
  TREADLE_F32 = 0,
  TREADLE_F64 = 1,
  TREADLE_I64 = 2,
  TREADLE_I32 = 3,
  TREADLE_DTYPE_MAX_ENUM = 0x7FFFFFFF
} treadle_dtype;

typedef struct treadle_model treadle_model;
typedef struct treadle_trainer treadle_trainer;
typedef struct treadle_replay treadle_replay;

/* The message of this thread's last error ("" when none); never NULL. */
TREADLE_C_API const char* treadle_last_error(void);
TREADLE_C_API const char* treadle_version(void);
/* Sets this thread's last error to `message` (NULL clears it) and returns `status`: for language
 * bindings that detect a mistake themselves (the Fortran module's dtype checks), so that it reads
 * back through treadle_last_error() like any other. */
TREADLE_C_API int treadle_set_last_error(int status, const char* message);

/* -- models ---------------------------------------------------------------------------------- */
/* A fresh model from a JSON description; parameters initialised as torch.nn does from the global
 * generator, seeded with `seed` first (treadle::manual_seed). */
TREADLE_C_API int treadle_model_from_json(const char* json, treadle_dtype dtype, uint64_t seed, treadle_model** out);
/* A model from a file written by treadle_model_save or the Python tl.save (architecture + weights). */
TREADLE_C_API int treadle_model_load(const char* path, treadle_model** out);
/* Loads weights (names and shapes must match) into an existing model; on error it is unchanged. */
TREADLE_C_API int treadle_model_load_weights(treadle_model* model, const char* path);
/* Writes weights and architecture (readable by tl.load in Python). */
TREADLE_C_API int treadle_model_save(const treadle_model* model, const char* path);
TREADLE_C_API void treadle_model_free(treadle_model* model); /* NULL is fine */

TREADLE_C_API int treadle_model_dtype(const treadle_model* model, treadle_dtype* out);
/* Number of values in the flat parameter buffer: all parameters in state_dict order, frozen state
 * included, with alignment padding between tensors (so it can exceed the sum of their sizes). */
TREADLE_C_API int treadle_model_num_parameters(const treadle_model* model, int64_t* out);
/* Copies the flat parameters (state_dict order) into / from a buffer of `count` values. Not while
 * a trainer of this model is inside a call. */
TREADLE_C_API int treadle_model_get_parameters(const treadle_model* model, void* buffer, int64_t count);
TREADLE_C_API int treadle_model_set_parameters(treadle_model* model, const void* buffer, int64_t count);

/* How the model's plans run (each call drops its compiled plans; not while a trainer of this model
 * is inside a call). backend: "" (priority order), "eigen", "onednn" (when built) or "auto" (the
 * measured dispatch table). precision of the matrix products: "float32", "bf16" or "fp16" (float32 models).
 * deterministic: nonzero for bitwise-reproducible plans (docs/hardening.md). fusion: nonzero (the default)
 * lets a linear or conv apply the relu/tanh/sigmoid after it itself (docs/architecture.md). */
TREADLE_C_API int treadle_model_set_backend(treadle_model* model, const char* backend);
TREADLE_C_API int treadle_model_set_precision(treadle_model* model, const char* precision);
TREADLE_C_API int treadle_model_set_deterministic(treadle_model* model, int deterministic);
TREADLE_C_API int treadle_model_set_fusion(treadle_model* model, int fusion);

/* Shape of the output for an input of shape x_shape: *out_ndim <= capacity entries in out_shape. */
TREADLE_C_API int treadle_model_output_shape(treadle_model* model, int x_ndim, const int64_t* x_shape,
                                             int capacity, int* out_ndim, int64_t* out_shape);
/* Inference (eval mode) into `y` (capacity `y_count` values). Thread-safe on a shared model. */
TREADLE_C_API int treadle_model_predict(treadle_model* model, const void* x, int x_ndim, const int64_t* x_shape,
                                        void* y, int64_t y_count);

/* -- training -------------------------------------------------------------------------------- */
/* loss: "mse", "l1", "huber", "cross_entropy", "bce_with_logits" (mean reduction).
 * optimizer: "sgd", "adam", "adamw", "rmsprop", "adagrad"; options: JSON object of torch.optim
 * keyword arguments ({"lr": 1e-3, "betas": [0.9, 0.999], "momentum": 0.9, ...}) or NULL for defaults.
 * The trainer keeps the model alive (treadle_model_free may be called first). */
TREADLE_C_API int treadle_trainer_create(treadle_model* model, const char* loss, const char* optimizer,
                                         const char* options_json, uint64_t seed, treadle_trainer** out);
TREADLE_C_API void treadle_trainer_free(treadle_trainer* trainer);

/* Targets hold the model's dtype, except class indices for cross_entropy: int64. */
/* zero_grad + forward + loss + backward + update; *loss (may be NULL) receives the loss. */
TREADLE_C_API int treadle_trainer_step(treadle_trainer* trainer, const void* x, int x_ndim, const int64_t* x_shape,
                                       const void* y, int y_ndim, const int64_t* y_shape, double* loss);
/* forward + loss in eval mode; touches no gradient or parameter. */
TREADLE_C_API int treadle_trainer_evaluate(treadle_trainer* trainer, const void* x, int x_ndim,
                                           const int64_t* x_shape, const void* y, int y_ndim,
                                           const int64_t* y_shape, double* loss);
/* Host-driven phases: forward (training mode) writes the output to `out` (capacity out_count) and
 * keeps activations; backward takes dL/d(output) (the output's shape) and accumulates parameter
 * gradients; update applies the optimizer. */
TREADLE_C_API int treadle_trainer_zero_grad(treadle_trainer* trainer);
TREADLE_C_API int treadle_trainer_forward(treadle_trainer* trainer, const void* x, int x_ndim, const int64_t* x_shape,
                                          void* out, int64_t out_count);
TREADLE_C_API int treadle_trainer_backward(treadle_trainer* trainer, const void* grad_out, int ndim,
                                           const int64_t* shape);
TREADLE_C_API int treadle_trainer_update(treadle_trainer* trainer);
/* The flat gradient buffer (same layout and count as the parameters). */
TREADLE_C_API int treadle_trainer_get_gradients(treadle_trainer* trainer, void* buffer, int64_t count);

/* -- replay buffers (treadle/replay.hpp) ------------------------------------------------------- */
/* A buffer of samples a simulation pushes between its time steps and a trainer samples from.
 * policy: "fifo", "firo" or "reservoir"; min_size: the watermark below which sampling is refused;
 * max_reuse: uses before a sample leaves (-1: the policy's default, 0: unlimited). Fields: nfields
 * names, each sample's ndims[i] dims (concatenated in shapes) and dtypes[i]. No thread; no allocation
 * after this call. */
TREADLE_C_API int treadle_replay_create(const char* policy, int64_t capacity, int64_t min_size, int64_t max_reuse,
                                        uint64_t seed, int nfields, const char* const* names, const int* ndims,
                                        const int64_t* shapes, const treadle_dtype* dtypes, treadle_replay** out);
TREADLE_C_API void treadle_replay_free(treadle_replay* buffer); /* NULL is fine */
/* Copies n samples: fields[i] points to n contiguous samples of field i. Checked before any copy. */
TREADLE_C_API int treadle_replay_push(treadle_replay* buffer, int64_t n, const void* const* fields);
/* Fills fields[i] (batch_size contiguous samples each) by the policy; TREADLE_ERROR_VALUE below the
 * watermark (nothing changes). */
TREADLE_C_API int treadle_replay_sample(treadle_replay* buffer, int64_t batch_size, void* const* fields);
/* *ready = 1 when sample(batch_size) may run; *size = the samples held. */
TREADLE_C_API int treadle_replay_ready(const treadle_replay* buffer, int64_t batch_size, int* ready);
TREADLE_C_API int treadle_replay_size(const treadle_replay* buffer, int64_t* size);

/* -- checkpoints ------------------------------------------------------------------------------ */
/* A training checkpoint (treadle/serialize.hpp) with nbuffers replay buffers saved under their names:
 * load restores the trainer and the buffers bit for bit, after checking every part (nothing changes
 * on an error). */
TREADLE_C_API int treadle_trainer_save_checkpoint(treadle_trainer* trainer, const char* path, int nbuffers,
                                                  const char* const* names, treadle_replay* const* buffers);
TREADLE_C_API int treadle_trainer_load_checkpoint(treadle_trainer* trainer, const char* path, int nbuffers,
                                                  const char* const* names, treadle_replay* const* buffers);

/* -- verification ---------------------------------------------------------------------------- */
/* The installation check (treadle/verify.hpp), as `python -m treadle verify` runs it: every op of the
 * catalog on every backend and dtype this build has and this machine runs, against the float64
 * reference and central differences, on fresh random inputs. quick != 0: central differences on 6
 * elements per input instead of all. ops, backends: comma-separated filters (NULL or "": all).
 * json_path: also writes the report there as JSON (NULL: no file). print != 0: writes the matrix and
 * the verdict to stdout. *failures receives the number of failed checks (0: everything passed).
 * TREADLE_ERROR_VALUE names an op without a case or a backend this build lacks. */
TREADLE_C_API int treadle_verify(int quick, const char* ops, const char* backends, uint64_t seed, const char* json_path,
                                 int print, int64_t* failures);

#ifdef __cplusplus
}
#endif

#endif /* TREADLE_TREADLE_H */
