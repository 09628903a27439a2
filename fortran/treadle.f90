! treadle from Fortran: a module over the C API (treadle/treadle.h), standard Fortran 2018 with
! ISO_C_BINDING. Shipped as source because .mod files are compiler-specific: compile it into the
! host, e.g. `add_executable(app main.f90 ${TREADLE_FORTRAN_SOURCE})` after find_package(treadle).
!
! Two modules: treadle_c (treadle_c.f90) declares every C function as c_treadle_* with treadle.h's
! arguments; this module, treadle, wraps them under treadle.h's names: functions returning an
! integer(c_int) status (TREADLE_OK = 0, or the C API's codes), Fortran strings in and out, arrays
! as contiguous assumed-rank arrays of real(c_float), real(c_double) or, for class indices,
! integer(c_int64_t) (non-contiguous sections are copied in and out by the compiler).
! treadle_error_message() returns the message of this thread's last error.
!
! Memory order. treadle's tensors are row-major (C order), Fortran arrays column-major, so a Fortran
! array of shape (d1, d2, ..., dn) holds the same memory as a row-major tensor of shape
! (dn, ..., d2, d1); the wrappers pass every array with its shape reversed. A batch of `batch`
! samples with `features` values each, the row-major (batch, features) tensor the model takes, is the
! Fortran array x(features, batch): x(:, i) is sample i, contiguous in memory. Outputs come back
! the same way, y(outputs, batch), and class indices (cross_entropy targets) are a rank-1
! integer(c_int64_t) array of length batch. Nothing is transposed: the memory is passed as it is.
!
! Checks beyond the C API's (reported as errors like any other, through treadle_error_message()):
! an array's kind must be the model's dtype (float32 models take real(c_float), float64 models
! real(c_double)) and a cross_entropy trainer's targets integer(c_int64_t); treadle_model_predict's
! y, when it has the output's rank, must have the output's shape (a transposed y has the right size
! but the wrong layout). Fixed-length strings lose their trailing blanks.
!
! Handles are plain values holding a C pointer: copying one does not copy the model, and
! treadle_model_free / treadle_trainer_free must be called once (they null the handle). The module
! keeps no state of its own, so it is as thread-safe as the C API (errors are per thread).
module treadle
  use, intrinsic :: iso_c_binding, only: c_associated, c_char, c_double, c_f_pointer, c_float, c_int, &
                                         c_int64_t, c_loc, c_null_char, c_null_ptr, c_ptr
  use treadle_c
  implicit none
  private

  public :: TREADLE_OK, TREADLE_ERROR_VALUE, TREADLE_ERROR_TYPE, TREADLE_ERROR_IO, TREADLE_ERROR_ARGUMENT
  public :: TREADLE_ERROR_MEMORY, TREADLE_ERROR_INTERNAL, TREADLE_ERROR_TIMEOUT, TREADLE_F32, TREADLE_F64
  public :: treadle_error_message, treadle_version
  public :: treadle_model_from_json, treadle_model_load, treadle_model_load_weights, treadle_model_save
  public :: treadle_model_free, treadle_model_dtype, treadle_model_num_parameters
  public :: treadle_model_get_parameters, treadle_model_set_parameters, treadle_model_output_shape
  public :: treadle_model_predict, treadle_trainer_create, treadle_trainer_free, treadle_trainer_step
  public :: treadle_trainer_evaluate, treadle_trainer_zero_grad, treadle_trainer_forward
  public :: treadle_trainer_backward, treadle_trainer_update, treadle_trainer_get_gradients
  public :: treadle_model_set_backend, treadle_model_set_precision, treadle_model_set_deterministic
  public :: treadle_model_set_fusion, treadle_verify
  public :: treadle_check_step_kinds  ! for modules built on this one (treadle_distributed)

  ! The kind of an integer(c_int64_t) array (class indices), next to TREADLE_F32/F64; -1: unknown.
  integer(c_int), parameter :: KIND_I64 = 2, KIND_UNKNOWN = -1

  type, public :: treadle_model
    type(c_ptr) :: handle = c_null_ptr
  end type treadle_model

  type, public :: treadle_trainer
    type(c_ptr) :: handle = c_null_ptr
    integer(c_int) :: dtype = KIND_UNKNOWN   ! the model's dtype, for checking arrays
    integer(c_int) :: target = KIND_UNKNOWN  ! the kind its loss takes as targets
  end type treadle_trainer

  ! Seeds: integer(c_int) or integer(c_int64_t) (the bits of C's uint64_t).
  interface treadle_model_from_json
    module procedure model_from_json_i32, model_from_json_i64
  end interface
  interface treadle_trainer_create
    module procedure trainer_create_i32, trainer_create_i64
  end interface
  ! Arrays: one specific per kind (for targets, per pair of kinds).
  interface treadle_model_get_parameters
    module procedure get_parameters_f32, get_parameters_f64
  end interface
  interface treadle_model_set_parameters
    module procedure set_parameters_f32, set_parameters_f64
  end interface
  interface treadle_model_predict
    module procedure predict_f32, predict_f64
  end interface
  interface treadle_trainer_step
    module procedure step_f32, step_f64, step_f32_i64, step_f64_i64
  end interface
  interface treadle_trainer_evaluate
    module procedure evaluate_f32, evaluate_f64, evaluate_f32_i64, evaluate_f64_i64
  end interface
  interface treadle_trainer_forward
    module procedure forward_f32, forward_f64
  end interface
  interface treadle_trainer_backward
    module procedure backward_f32, backward_f64
  end interface
  interface treadle_trainer_get_gradients
    module procedure get_gradients_f32, get_gradients_f64
  end interface

contains

  ! -- strings, shapes and checks --------------------------------------------------------------

  ! A NUL-terminated copy of s without its trailing blanks (fixed-length variables are blank-padded).
  function c_string(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=:), allocatable :: c
    c = trim(s) // c_null_char
  end function c_string

  function f_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    n = 0
    if (c_associated(p)) n = int(c_strlen(p))
    allocate (character(len=n) :: s)
    if (n == 0) return
    call c_f_pointer(p, chars, [n])
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function f_string

  ! The row-major shape of a Fortran array of shape fortran_shape: the same dimensions, reversed.
  pure function row_major(fortran_shape) result(s)
    integer(c_int64_t), intent(in) :: fortran_shape(:)
    integer(c_int64_t) :: s(size(fortran_shape))
    s = fortran_shape(size(fortran_shape):1:-1)
  end function row_major

  function shape_text(s) result(text)
    integer(c_int64_t), intent(in) :: s(:)
    character(len=:), allocatable :: text
    character(len=24) :: item
    integer :: i
    text = '('
    do i = 1, size(s)
      write (item, '(i0)') s(i)
      text = text // trim(item)
      if (i < size(s)) text = text // ', '
    end do
    text = text // ')'
  end function shape_text

  function kind_text(kind) result(text)
    integer(c_int), intent(in) :: kind
    character(len=:), allocatable :: text
    select case (kind)
    case (TREADLE_F32)
      text = 'float32 values (real(c_float))'
    case (TREADLE_F64)
      text = 'float64 values (real(c_double))'
    case default
      text = 'int64 class indices (integer(c_int64_t))'
    end select
  end function kind_text

  ! TREADLE_OK when an array of kind `given` is what `who` needs (`expected`, unchecked when unknown);
  ! otherwise records the error as the C API does and returns TREADLE_ERROR_TYPE.
  function check_kind(who, what, expected, given) result(status)
    character(len=*), intent(in) :: who, what
    integer(c_int), intent(in) :: expected, given
    integer(c_int) :: status
    status = TREADLE_OK
    if (expected == KIND_UNKNOWN .or. expected == given) return
    status = c_treadle_set_last_error(TREADLE_ERROR_TYPE, c_string(who // ': expected ' // what // ' of ' // &
                                      kind_text(expected) // ', got ' // kind_text(given)))
  end function check_kind

  ! The checks of treadle_trainer_step's arrays, for `who` (a step taken through another module): x
  ! of the model's kind, y of the kind the trainer's loss takes (TREADLE_F32, TREADLE_F64, TREADLE_I64).
  function treadle_check_step_kinds(who, trainer, x_kind, y_kind) result(status)
    character(len=*), intent(in) :: who
    type(treadle_trainer), intent(in) :: trainer
    integer(c_int), intent(in) :: x_kind, y_kind
    integer(c_int) :: status
    status = check_kind(who, 'x', trainer%dtype, x_kind)
    if (status == TREADLE_OK) status = check_kind(who, 'y', trainer%target, y_kind)
  end function treadle_check_step_kinds

  ! The model's dtype, or KIND_UNKNOWN for a null handle (the C call that follows reports that).
  function dtype_of(model) result(dtype)
    type(treadle_model), intent(in) :: model
    integer(c_int) :: dtype
    if (c_treadle_model_dtype(model%handle, dtype) /= TREADLE_OK) dtype = KIND_UNKNOWN
  end function dtype_of

  ! -- errors and version ----------------------------------------------------------------------

  ! The message of this thread's last error ('' when none), e.g.
  ! "treadle_model_predict: y holds 1 values, 2 needed".
  function treadle_error_message() result(message)
    character(len=:), allocatable :: message
    message = f_string(c_treadle_last_error())
  end function treadle_error_message

  function treadle_version() result(version)
    character(len=:), allocatable :: version
    version = f_string(c_treadle_version())
  end function treadle_version

  ! -- models ----------------------------------------------------------------------------------

  ! A fresh model from a JSON description (see treadle.h), dtype TREADLE_F32 or TREADLE_F64,
  ! parameters initialised as torch.nn does from the global generator seeded with `seed`.
  function model_from_json_i64(json, dtype, seed, model) result(status)
    character(len=*), intent(in) :: json
    integer(c_int), intent(in) :: dtype
    integer(c_int64_t), intent(in) :: seed
    type(treadle_model), intent(out) :: model
    integer(c_int) :: status
    status = c_treadle_model_from_json(c_string(json), dtype, seed, model%handle)
  end function model_from_json_i64

  function model_from_json_i32(json, dtype, seed, model) result(status)
    character(len=*), intent(in) :: json
    integer(c_int), intent(in) :: dtype, seed
    type(treadle_model), intent(out) :: model
    integer(c_int) :: status
    status = model_from_json_i64(json, dtype, int(seed, c_int64_t), model)
  end function model_from_json_i32

  ! A model from a file written by treadle_model_save or Python's tl.save.
  function treadle_model_load(path, model) result(status)
    character(len=*), intent(in) :: path
    type(treadle_model), intent(out) :: model
    integer(c_int) :: status
    status = c_treadle_model_load(c_string(path), model%handle)
  end function treadle_model_load

  function treadle_model_load_weights(model, path) result(status)
    type(treadle_model), intent(in) :: model
    character(len=*), intent(in) :: path
    integer(c_int) :: status
    status = c_treadle_model_load_weights(model%handle, c_string(path))
  end function treadle_model_load_weights

  function treadle_model_save(model, path) result(status)
    type(treadle_model), intent(in) :: model
    character(len=*), intent(in) :: path
    integer(c_int) :: status
    status = c_treadle_model_save(model%handle, c_string(path))
  end function treadle_model_save

  ! backend: "" (priority order), "eigen", "onednn" or "auto"; each call recompiles the model's plans.
  function treadle_model_set_backend(model, backend) result(status)
    type(treadle_model), intent(in) :: model
    character(len=*), intent(in) :: backend
    integer(c_int) :: status
    status = c_treadle_model_set_backend(model%handle, c_string(backend))
  end function treadle_model_set_backend

  ! The installation check (treadle_verify in treadle.h): every op on every backend and dtype this
  ! machine runs, the matrix printed to standard output. failures: the number of failed checks (0:
  ! all passed). quick: finite differences on 6 elements per input; ops, backends: comma-separated
  ! filters (absent: all); json_path: also write the report as JSON.
  function treadle_verify(failures, quick, ops, backends, json_path) result(status)
    integer(c_int64_t), intent(out) :: failures
    logical, intent(in), optional :: quick
    character(len=*), intent(in), optional :: ops, backends, json_path
    integer(c_int) :: status, quick_flag
    quick_flag = 0
    if (present(quick)) then
      if (quick) quick_flag = 1
    end if
    status = c_treadle_verify(quick_flag, c_string(text_or_blank(ops)), c_string(text_or_blank(backends)), &
                              0_c_int64_t, c_string(text_or_blank(json_path)), 1_c_int, failures)
  end function treadle_verify

  function text_or_blank(text) result(out)
    character(len=*), intent(in), optional :: text
    character(len=:), allocatable :: out
    out = ''
    if (present(text)) out = text
  end function text_or_blank

  ! precision of the matrix products: "float32" or "bf16" (float32 models only).
  function treadle_model_set_precision(model, precision) result(status)
    type(treadle_model), intent(in) :: model
    character(len=*), intent(in) :: precision
    integer(c_int) :: status
    status = c_treadle_model_set_precision(model%handle, c_string(precision))
  end function treadle_model_set_precision

  ! .true. for bitwise-reproducible plans (docs/hardening.md).
  function treadle_model_set_deterministic(model, deterministic) result(status)
    type(treadle_model), intent(in) :: model
    logical, intent(in) :: deterministic
    integer(c_int) :: status
    status = c_treadle_model_set_deterministic(model%handle, merge(1_c_int, 0_c_int, deterministic))
  end function treadle_model_set_deterministic

  ! .false. runs every node as traced; .true. (the default) lets a linear or conv apply the
  ! relu/tanh/sigmoid after it itself (docs/architecture.md).
  function treadle_model_set_fusion(model, fusion) result(status)
    type(treadle_model), intent(in) :: model
    logical, intent(in) :: fusion
    integer(c_int) :: status
    status = c_treadle_model_set_fusion(model%handle, merge(1_c_int, 0_c_int, fusion))
  end function treadle_model_set_fusion

  subroutine treadle_model_free(model)
    type(treadle_model), intent(inout) :: model
    call c_treadle_model_free(model%handle)
    model%handle = c_null_ptr
  end subroutine treadle_model_free

  function treadle_model_dtype(model, dtype) result(status)
    type(treadle_model), intent(in) :: model
    integer(c_int), intent(out) :: dtype
    integer(c_int) :: status
    status = c_treadle_model_dtype(model%handle, dtype)
  end function treadle_model_dtype

  ! The length of the flat parameter buffer (treadle.h: it includes alignment padding).
  function treadle_model_num_parameters(model, count) result(status)
    type(treadle_model), intent(in) :: model
    integer(c_int64_t), intent(out) :: count
    integer(c_int) :: status
    status = c_treadle_model_num_parameters(model%handle, count)
  end function treadle_model_num_parameters

  function get_parameters_f32(model, buffer) result(status)
    type(treadle_model), intent(in) :: model
    real(c_float), dimension(..), contiguous, target, intent(inout) :: buffer
    integer(c_int) :: status
    status = check_kind('treadle_model_get_parameters', 'buffer', dtype_of(model), TREADLE_F32)
    if (status == TREADLE_OK) &
      status = c_treadle_model_get_parameters(model%handle, c_loc(buffer), size(buffer, kind=c_int64_t))
  end function get_parameters_f32

  function get_parameters_f64(model, buffer) result(status)
    type(treadle_model), intent(in) :: model
    real(c_double), dimension(..), contiguous, target, intent(inout) :: buffer
    integer(c_int) :: status
    status = check_kind('treadle_model_get_parameters', 'buffer', dtype_of(model), TREADLE_F64)
    if (status == TREADLE_OK) &
      status = c_treadle_model_get_parameters(model%handle, c_loc(buffer), size(buffer, kind=c_int64_t))
  end function get_parameters_f64

  function set_parameters_f32(model, buffer) result(status)
    type(treadle_model), intent(in) :: model
    real(c_float), dimension(..), contiguous, target, intent(in) :: buffer
    integer(c_int) :: status
    status = check_kind('treadle_model_set_parameters', 'buffer', dtype_of(model), TREADLE_F32)
    if (status == TREADLE_OK) &
      status = c_treadle_model_set_parameters(model%handle, c_loc(buffer), size(buffer, kind=c_int64_t))
  end function set_parameters_f32

  function set_parameters_f64(model, buffer) result(status)
    type(treadle_model), intent(in) :: model
    real(c_double), dimension(..), contiguous, target, intent(in) :: buffer
    integer(c_int) :: status
    status = check_kind('treadle_model_set_parameters', 'buffer', dtype_of(model), TREADLE_F64)
    if (status == TREADLE_OK) &
      status = c_treadle_model_set_parameters(model%handle, c_loc(buffer), size(buffer, kind=c_int64_t))
  end function set_parameters_f64

  ! The output's shape for an input of shape x_shape, both in Fortran order (x_shape = [features,
  ! batch] gives [outputs, batch]): out_shape(1:out_ndim), size(out_shape) >= out_ndim.
  function treadle_model_output_shape(model, x_shape, out_shape, out_ndim) result(status)
    type(treadle_model), intent(in) :: model
    integer(c_int64_t), intent(in) :: x_shape(:)
    integer(c_int64_t), intent(inout) :: out_shape(:)
    integer(c_int), intent(out) :: out_ndim
    integer(c_int) :: status
    integer(c_int64_t) :: s(size(out_shape))
    out_ndim = 0
    status = c_treadle_model_output_shape(model%handle, size(x_shape, kind=c_int), row_major(x_shape), &
                                          size(out_shape, kind=c_int), out_ndim, s)
    if (status == TREADLE_OK) out_shape(1:out_ndim) = row_major(s(1:out_ndim))
  end function treadle_model_output_shape

  ! Inference (eval mode): x(features, batch) -> y(outputs, batch). Thread-safe on a shared model.
  function predict_f32(model, x, y) result(status)
    type(treadle_model), intent(in) :: model
    real(c_float), dimension(..), contiguous, target, intent(in) :: x
    real(c_float), dimension(..), contiguous, target, intent(inout) :: y
    integer(c_int) :: status
    status = predict(model, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), c_loc(y), shape(y, kind=c_int64_t))
  end function predict_f32

  function predict_f64(model, x, y) result(status)
    type(treadle_model), intent(in) :: model
    real(c_double), dimension(..), contiguous, target, intent(in) :: x
    real(c_double), dimension(..), contiguous, target, intent(inout) :: y
    integer(c_int) :: status
    status = predict(model, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), c_loc(y), shape(y, kind=c_int64_t))
  end function predict_f64

  function predict(model, kind, x, x_shape, y, y_shape) result(status)
    type(treadle_model), intent(in) :: model
    integer(c_int), intent(in) :: kind
    type(c_ptr), intent(in) :: x, y
    integer(c_int64_t), intent(in) :: x_shape(:), y_shape(:)
    integer(c_int) :: status
    character(len=*), parameter :: who = 'treadle_model_predict'
    integer(c_int64_t) :: out_shape(16)
    integer(c_int) :: out_ndim
    status = check_kind(who, 'x', dtype_of(model), kind)
    if (status /= TREADLE_OK) return
    ! A y of the output's rank must have its shape: a transposed y(batch, outputs) has the right
    ! size but not the layout. (A bad x is left to the C call, whose message names the function.)
    if (treadle_model_output_shape(model, x_shape, out_shape, out_ndim) == TREADLE_OK) then
      if (out_ndim == size(y_shape)) then
        if (any(out_shape(1:out_ndim) /= y_shape)) then
          status = c_treadle_set_last_error(TREADLE_ERROR_VALUE, c_string(who // ': y has shape ' // &
              shape_text(y_shape) // ', the output has shape ' // shape_text(out_shape(1:out_ndim)) // &
              ' (Fortran order: outputs, batch)'))
          return
        end if
      end if
    end if
    status = c_treadle_model_predict(model%handle, x, size(x_shape, kind=c_int), row_major(x_shape), y, &
                                     product(y_shape))
  end function predict

  ! -- training --------------------------------------------------------------------------------

  ! loss: "mse", "l1", "huber", "cross_entropy", "bce_with_logits"; optimizer: "sgd", "adam",
  ! "adamw", "rmsprop", "adagrad"; options: a JSON object of torch.optim keyword arguments
  ! ('{"lr": 0.01}'), or '' for the defaults. The trainer keeps the model alive.
  function trainer_create_i64(model, loss, optimizer, options, seed, trainer) result(status)
    type(treadle_model), intent(in) :: model
    character(len=*), intent(in) :: loss, optimizer, options
    integer(c_int64_t), intent(in) :: seed
    type(treadle_trainer), intent(out) :: trainer
    integer(c_int) :: status
    status = c_treadle_trainer_create(model%handle, c_string(loss), c_string(optimizer), c_string(options), seed, &
                                      trainer%handle)
    if (status /= TREADLE_OK) return
    trainer%dtype = dtype_of(model)
    trainer%target = trainer%dtype
    if (trim(loss) == 'cross_entropy') trainer%target = KIND_I64
  end function trainer_create_i64

  function trainer_create_i32(model, loss, optimizer, options, seed, trainer) result(status)
    type(treadle_model), intent(in) :: model
    character(len=*), intent(in) :: loss, optimizer, options
    integer(c_int), intent(in) :: seed
    type(treadle_trainer), intent(out) :: trainer
    integer(c_int) :: status
    status = trainer_create_i64(model, loss, optimizer, options, int(seed, c_int64_t), trainer)
  end function trainer_create_i32

  subroutine treadle_trainer_free(trainer)
    type(treadle_trainer), intent(inout) :: trainer
    call c_treadle_trainer_free(trainer%handle)
    trainer%handle = c_null_ptr
  end subroutine treadle_trainer_free

  ! zero_grad + forward + loss + backward + update on x(features, batch) and targets y (the
  ! output's shape, or class indices y(batch)); loss, when present, receives the loss.
  function step_f32(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(in) :: x, y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.false., trainer, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), &
                      TREADLE_F32, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function step_f32

  function step_f64(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(in) :: x, y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.false., trainer, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), &
                      TREADLE_F64, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function step_f64

  function step_f32_i64(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(in) :: x
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.false., trainer, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), &
                      KIND_I64, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function step_f32_i64

  function step_f64_i64(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(in) :: x
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.false., trainer, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), &
                      KIND_I64, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function step_f64_i64

  ! forward + loss in eval mode (no gradient, no update); arguments as treadle_trainer_step's.
  function evaluate_f32(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(in) :: x, y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.true., trainer, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), &
                      TREADLE_F32, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function evaluate_f32

  function evaluate_f64(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(in) :: x, y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.true., trainer, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), &
                      TREADLE_F64, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function evaluate_f64

  function evaluate_f32_i64(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(in) :: x
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.true., trainer, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), &
                      KIND_I64, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function evaluate_f32_i64

  function evaluate_f64_i64(trainer, x, y, loss) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(in) :: x
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(.true., trainer, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), &
                      KIND_I64, c_loc(y), shape(y, kind=c_int64_t), loss)
  end function evaluate_f64_i64

  ! treadle_trainer_evaluate (evaluate) or treadle_trainer_step, after checking the arrays' kinds.
  function run_step(evaluate, trainer, x_kind, x, x_shape, y_kind, y, y_shape, loss) result(status)
    logical, intent(in) :: evaluate
    type(treadle_trainer), intent(in) :: trainer
    integer(c_int), intent(in) :: x_kind, y_kind
    type(c_ptr), intent(in) :: x, y
    integer(c_int64_t), intent(in) :: x_shape(:), y_shape(:)
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    type(c_ptr) :: loss_ptr
    character(len=:), allocatable :: who
    who = 'treadle_trainer_step'
    if (evaluate) who = 'treadle_trainer_evaluate'
    status = treadle_check_step_kinds(who, trainer, x_kind, y_kind)
    if (status /= TREADLE_OK) return
    loss_ptr = c_null_ptr
    if (present(loss)) loss_ptr = c_loc(loss)
    if (evaluate) then
      status = c_treadle_trainer_evaluate(trainer%handle, x, size(x_shape, kind=c_int), row_major(x_shape), &
                                          y, size(y_shape, kind=c_int), row_major(y_shape), loss_ptr)
    else
      status = c_treadle_trainer_step(trainer%handle, x, size(x_shape, kind=c_int), row_major(x_shape), &
                                      y, size(y_shape, kind=c_int), row_major(y_shape), loss_ptr)
    end if
  end function run_step

  function treadle_trainer_zero_grad(trainer) result(status)
    type(treadle_trainer), intent(in) :: trainer
    integer(c_int) :: status
    status = c_treadle_trainer_zero_grad(trainer%handle)
  end function treadle_trainer_zero_grad

  ! Host-driven phases. forward (training mode) writes the output into out(outputs, batch) (only its
  ! size is checked) and keeps activations; backward takes dL/d(output), shaped as out, and
  ! accumulates parameter gradients; treadle_trainer_update applies the optimizer.
  function forward_f32(trainer, x, out) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(in) :: x
    real(c_float), dimension(..), contiguous, target, intent(inout) :: out
    integer(c_int) :: status
    status = check_kind('treadle_trainer_forward', 'x', trainer%dtype, TREADLE_F32)
    if (status == TREADLE_OK) status = c_treadle_trainer_forward(trainer%handle, c_loc(x), rank(x), &
        row_major(shape(x, kind=c_int64_t)), c_loc(out), size(out, kind=c_int64_t))
  end function forward_f32

  function forward_f64(trainer, x, out) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(in) :: x
    real(c_double), dimension(..), contiguous, target, intent(inout) :: out
    integer(c_int) :: status
    status = check_kind('treadle_trainer_forward', 'x', trainer%dtype, TREADLE_F64)
    if (status == TREADLE_OK) status = c_treadle_trainer_forward(trainer%handle, c_loc(x), rank(x), &
        row_major(shape(x, kind=c_int64_t)), c_loc(out), size(out, kind=c_int64_t))
  end function forward_f64

  function backward_f32(trainer, grad_out) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(in) :: grad_out
    integer(c_int) :: status
    status = check_kind('treadle_trainer_backward', 'grad_out', trainer%dtype, TREADLE_F32)
    if (status == TREADLE_OK) status = c_treadle_trainer_backward(trainer%handle, c_loc(grad_out), &
        rank(grad_out), row_major(shape(grad_out, kind=c_int64_t)))
  end function backward_f32

  function backward_f64(trainer, grad_out) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(in) :: grad_out
    integer(c_int) :: status
    status = check_kind('treadle_trainer_backward', 'grad_out', trainer%dtype, TREADLE_F64)
    if (status == TREADLE_OK) status = c_treadle_trainer_backward(trainer%handle, c_loc(grad_out), &
        rank(grad_out), row_major(shape(grad_out, kind=c_int64_t)))
  end function backward_f64

  function treadle_trainer_update(trainer) result(status)
    type(treadle_trainer), intent(in) :: trainer
    integer(c_int) :: status
    status = c_treadle_trainer_update(trainer%handle)
  end function treadle_trainer_update

  ! The flat gradient buffer (the layout and length of the parameters).
  function get_gradients_f32(trainer, buffer) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_float), dimension(..), contiguous, target, intent(inout) :: buffer
    integer(c_int) :: status
    status = check_kind('treadle_trainer_get_gradients', 'buffer', trainer%dtype, TREADLE_F32)
    if (status == TREADLE_OK) &
      status = c_treadle_trainer_get_gradients(trainer%handle, c_loc(buffer), size(buffer, kind=c_int64_t))
  end function get_gradients_f32

  function get_gradients_f64(trainer, buffer) result(status)
    type(treadle_trainer), intent(in) :: trainer
    real(c_double), dimension(..), contiguous, target, intent(inout) :: buffer
    integer(c_int) :: status
    status = check_kind('treadle_trainer_get_gradients', 'buffer', trainer%dtype, TREADLE_F64)
    if (status == TREADLE_OK) &
      status = c_treadle_trainer_get_gradients(trainer%handle, c_loc(buffer), size(buffer, kind=c_int64_t))
  end function get_gradients_f64

end module treadle
