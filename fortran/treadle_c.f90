! The C API of treadle (treadle/treadle.h) as Fortran interfaces: module treadle_c, one interface per
! C function under the C name with a c_ prefix, with treadle.h's arguments (strings NUL-terminated,
! buffers as type(c_ptr), shapes row-major int64). Most programs `use treadle` (treadle.f90), which
! wraps these for Fortran strings and arrays; this layer is for what the wrappers do not cover.
module treadle_c
  use, intrinsic :: iso_c_binding, only: c_char, c_int, c_int64_t, c_ptr, c_size_t
  implicit none
  private

  ! Status codes (enum treadle_status) and dtypes (enum treadle_dtype).
  integer(c_int), parameter, public :: TREADLE_OK = 0
  integer(c_int), parameter, public :: TREADLE_ERROR_VALUE = 1     ! bad value or shape
  integer(c_int), parameter, public :: TREADLE_ERROR_TYPE = 2      ! bad dtype or array kind
  integer(c_int), parameter, public :: TREADLE_ERROR_IO = 3        ! file system error
  integer(c_int), parameter, public :: TREADLE_ERROR_ARGUMENT = 4  ! null handle, bad rank, array too small
  integer(c_int), parameter, public :: TREADLE_ERROR_MEMORY = 5
  integer(c_int), parameter, public :: TREADLE_ERROR_INTERNAL = 6
  integer(c_int), parameter, public :: TREADLE_ERROR_TIMEOUT = 7
  integer(c_int), parameter, public :: TREADLE_F32 = 0, TREADLE_F64 = 1
  integer(c_int), parameter, public :: TREADLE_I64 = 2, TREADLE_I32 = 3  ! replay buffer fields only

  public :: c_treadle_last_error, c_treadle_version, c_treadle_set_last_error
  public :: c_treadle_model_from_json, c_treadle_model_load, c_treadle_model_load_weights, c_treadle_model_save
  public :: c_treadle_model_free, c_treadle_model_dtype, c_treadle_model_num_parameters
  public :: c_treadle_model_get_parameters, c_treadle_model_set_parameters, c_treadle_model_output_shape
  public :: c_treadle_model_predict, c_treadle_trainer_create, c_treadle_trainer_free, c_treadle_trainer_step
  public :: c_treadle_trainer_evaluate, c_treadle_trainer_zero_grad, c_treadle_trainer_forward
  public :: c_treadle_trainer_backward, c_treadle_trainer_update, c_treadle_trainer_get_gradients, c_strlen
  public :: c_treadle_model_set_backend, c_treadle_model_set_precision, c_treadle_model_set_deterministic
  public :: c_treadle_model_set_fusion, c_treadle_verify
  public :: c_treadle_replay_create, c_treadle_replay_free, c_treadle_replay_push, c_treadle_replay_sample
  public :: c_treadle_replay_ready, c_treadle_replay_size
  public :: c_treadle_trainer_save_checkpoint, c_treadle_trainer_load_checkpoint

  interface
    function c_treadle_last_error() result(message) bind(C, name="treadle_last_error")
      import :: c_ptr
      type(c_ptr) :: message
    end function c_treadle_last_error

    function c_treadle_version() result(version) bind(C, name="treadle_version")
      import :: c_ptr
      type(c_ptr) :: version
    end function c_treadle_version

    function c_treadle_set_last_error(status, message) result(status_out) bind(C, name="treadle_set_last_error")
      import :: c_char, c_int
      integer(c_int), value :: status
      character(kind=c_char), dimension(*), intent(in) :: message
      integer(c_int) :: status_out
    end function c_treadle_set_last_error

    function c_treadle_model_from_json(json, dtype, seed, out) result(status) bind(C, name="treadle_model_from_json")
      import :: c_char, c_int, c_int64_t, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: json
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: seed  ! uint64_t in C: the same bits
      type(c_ptr), intent(out) :: out
      integer(c_int) :: status
    end function c_treadle_model_from_json

    function c_treadle_model_load(path, out) result(status) bind(C, name="treadle_model_load")
      import :: c_char, c_int, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: path
      type(c_ptr), intent(out) :: out
      integer(c_int) :: status
    end function c_treadle_model_load

    function c_treadle_model_load_weights(model, path) result(status) bind(C, name="treadle_model_load_weights")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function c_treadle_model_load_weights

    ! The installation check: ops and backends comma-separated (c_null_char alone: all), json_path
    ! c_null_char alone for no file; failures receives the number of failed checks.
    function c_treadle_verify(quick, ops, backends, seed, json_path, print, failures) result(status) &
        bind(C, name="treadle_verify")
      import :: c_char, c_int, c_int64_t
      integer(c_int), value :: quick, print
      character(kind=c_char), dimension(*), intent(in) :: ops, backends, json_path
      integer(c_int64_t), value :: seed
      integer(c_int64_t), intent(out) :: failures
      integer(c_int) :: status
    end function c_treadle_verify

    ! Replay buffers (treadle.h): names, buffers and fields are arrays of type(c_ptr) (c_loc of
    ! NUL-terminated strings, of handles, of contiguous arrays); shapes concatenated, row-major.
    function c_treadle_replay_create(policy, capacity, min_size, max_reuse, seed, nfields, names, ndims, shapes, &
                                     dtypes, out) result(status) bind(C, name="treadle_replay_create")
      import :: c_char, c_int, c_int64_t, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: policy
      integer(c_int64_t), value :: capacity, min_size, max_reuse, seed
      integer(c_int), value :: nfields
      type(c_ptr), dimension(*), intent(in) :: names
      integer(c_int), dimension(*), intent(in) :: ndims, dtypes
      integer(c_int64_t), dimension(*), intent(in) :: shapes
      type(c_ptr), intent(out) :: out
      integer(c_int) :: status
    end function c_treadle_replay_create

    subroutine c_treadle_replay_free(buffer) bind(C, name="treadle_replay_free")
      import :: c_ptr
      type(c_ptr), value :: buffer
    end subroutine c_treadle_replay_free

    function c_treadle_replay_push(buffer, n, fields) result(status) bind(C, name="treadle_replay_push")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: buffer
      integer(c_int64_t), value :: n
      type(c_ptr), dimension(*), intent(in) :: fields
      integer(c_int) :: status
    end function c_treadle_replay_push

    function c_treadle_replay_sample(buffer, batch_size, fields) result(status) bind(C, name="treadle_replay_sample")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: buffer
      integer(c_int64_t), value :: batch_size
      type(c_ptr), dimension(*), intent(in) :: fields
      integer(c_int) :: status
    end function c_treadle_replay_sample

    function c_treadle_replay_ready(buffer, batch_size, ready) result(status) bind(C, name="treadle_replay_ready")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: buffer
      integer(c_int64_t), value :: batch_size
      integer(c_int), intent(out) :: ready
      integer(c_int) :: status
    end function c_treadle_replay_ready

    function c_treadle_replay_size(buffer, size) result(status) bind(C, name="treadle_replay_size")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: buffer
      integer(c_int64_t), intent(out) :: size
      integer(c_int) :: status
    end function c_treadle_replay_size

    function c_treadle_trainer_save_checkpoint(trainer, path, nbuffers, names, buffers) result(status) &
        bind(C, name="treadle_trainer_save_checkpoint")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: trainer
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int), value :: nbuffers
      type(c_ptr), dimension(*), intent(in) :: names, buffers
      integer(c_int) :: status
    end function c_treadle_trainer_save_checkpoint

    function c_treadle_trainer_load_checkpoint(trainer, path, nbuffers, names, buffers) result(status) &
        bind(C, name="treadle_trainer_load_checkpoint")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: trainer
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int), value :: nbuffers
      type(c_ptr), dimension(*), intent(in) :: names, buffers
      integer(c_int) :: status
    end function c_treadle_trainer_load_checkpoint

    function c_treadle_model_save(model, path) result(status) bind(C, name="treadle_model_save")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function c_treadle_model_save

    function c_treadle_model_set_backend(model, backend) result(status) bind(C, name="treadle_model_set_backend")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: backend
      integer(c_int) :: status
    end function c_treadle_model_set_backend

    function c_treadle_model_set_precision(model, precision) result(status) &
        bind(C, name="treadle_model_set_precision")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: precision
      integer(c_int) :: status
    end function c_treadle_model_set_precision

    function c_treadle_model_set_deterministic(model, deterministic) result(status) &
        bind(C, name="treadle_model_set_deterministic")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
      integer(c_int), value :: deterministic
      integer(c_int) :: status
    end function c_treadle_model_set_deterministic

    function c_treadle_model_set_fusion(model, fusion) result(status) bind(C, name="treadle_model_set_fusion")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
      integer(c_int), value :: fusion
      integer(c_int) :: status
    end function c_treadle_model_set_fusion

    subroutine c_treadle_model_free(model) bind(C, name="treadle_model_free")
      import :: c_ptr
      type(c_ptr), value :: model
    end subroutine c_treadle_model_free

    function c_treadle_model_dtype(model, out) result(status) bind(C, name="treadle_model_dtype")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
      integer(c_int), intent(out) :: out
      integer(c_int) :: status
    end function c_treadle_model_dtype

    function c_treadle_model_num_parameters(model, out) result(status) bind(C, name="treadle_model_num_parameters")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model
      integer(c_int64_t), intent(out) :: out
      integer(c_int) :: status
    end function c_treadle_model_num_parameters

    function c_treadle_model_get_parameters(model, buffer, count) result(status) &
        bind(C, name="treadle_model_get_parameters")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model, buffer
      integer(c_int64_t), value :: count
      integer(c_int) :: status
    end function c_treadle_model_get_parameters

    function c_treadle_model_set_parameters(model, buffer, count) result(status) &
        bind(C, name="treadle_model_set_parameters")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model, buffer
      integer(c_int64_t), value :: count
      integer(c_int) :: status
    end function c_treadle_model_set_parameters

    function c_treadle_model_output_shape(model, x_ndim, x_shape, capacity, out_ndim, out_shape) result(status) &
        bind(C, name="treadle_model_output_shape")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model
      integer(c_int), value :: x_ndim, capacity
      integer(c_int64_t), dimension(*), intent(in) :: x_shape
      integer(c_int), intent(out) :: out_ndim
      integer(c_int64_t), dimension(*), intent(inout) :: out_shape
      integer(c_int) :: status
    end function c_treadle_model_output_shape

    function c_treadle_model_predict(model, x, x_ndim, x_shape, y, y_count) result(status) &
        bind(C, name="treadle_model_predict")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model, x, y
      integer(c_int), value :: x_ndim
      integer(c_int64_t), dimension(*), intent(in) :: x_shape
      integer(c_int64_t), value :: y_count
      integer(c_int) :: status
    end function c_treadle_model_predict

    ! options_json: a JSON object, or "" (just the NUL) for the optimizer's defaults.
    function c_treadle_trainer_create(model, loss, optimizer, options_json, seed, out) result(status) &
        bind(C, name="treadle_trainer_create")
      import :: c_char, c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: loss, optimizer, options_json
      integer(c_int64_t), value :: seed
      type(c_ptr), intent(out) :: out
      integer(c_int) :: status
    end function c_treadle_trainer_create

    subroutine c_treadle_trainer_free(trainer) bind(C, name="treadle_trainer_free")
      import :: c_ptr
      type(c_ptr), value :: trainer
    end subroutine c_treadle_trainer_free

    ! loss: c_loc of a real(c_double), or c_null_ptr (here and in c_treadle_trainer_evaluate).
    function c_treadle_trainer_step(trainer, x, x_ndim, x_shape, y, y_ndim, y_shape, loss) result(status) &
        bind(C, name="treadle_trainer_step")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: trainer, x, y, loss
      integer(c_int), value :: x_ndim, y_ndim
      integer(c_int64_t), dimension(*), intent(in) :: x_shape, y_shape
      integer(c_int) :: status
    end function c_treadle_trainer_step

    function c_treadle_trainer_evaluate(trainer, x, x_ndim, x_shape, y, y_ndim, y_shape, loss) result(status) &
        bind(C, name="treadle_trainer_evaluate")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: trainer, x, y, loss
      integer(c_int), value :: x_ndim, y_ndim
      integer(c_int64_t), dimension(*), intent(in) :: x_shape, y_shape
      integer(c_int) :: status
    end function c_treadle_trainer_evaluate

    function c_treadle_trainer_zero_grad(trainer) result(status) bind(C, name="treadle_trainer_zero_grad")
      import :: c_int, c_ptr
      type(c_ptr), value :: trainer
      integer(c_int) :: status
    end function c_treadle_trainer_zero_grad

    function c_treadle_trainer_forward(trainer, x, x_ndim, x_shape, out, out_count) result(status) &
        bind(C, name="treadle_trainer_forward")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: trainer, x, out
      integer(c_int), value :: x_ndim
      integer(c_int64_t), dimension(*), intent(in) :: x_shape
      integer(c_int64_t), value :: out_count
      integer(c_int) :: status
    end function c_treadle_trainer_forward

    function c_treadle_trainer_backward(trainer, grad_out, ndim, shape) result(status) &
        bind(C, name="treadle_trainer_backward")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: trainer, grad_out
      integer(c_int), value :: ndim
      integer(c_int64_t), dimension(*), intent(in) :: shape
      integer(c_int) :: status
    end function c_treadle_trainer_backward

    function c_treadle_trainer_update(trainer) result(status) bind(C, name="treadle_trainer_update")
      import :: c_int, c_ptr
      type(c_ptr), value :: trainer
      integer(c_int) :: status
    end function c_treadle_trainer_update

    function c_treadle_trainer_get_gradients(trainer, buffer, count) result(status) &
        bind(C, name="treadle_trainer_get_gradients")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: trainer, buffer
      integer(c_int64_t), value :: count
      integer(c_int) :: status
    end function c_treadle_trainer_get_gradients

    ! for reading C strings (treadle_error_message, treadle_version)
    function c_strlen(s) result(n) bind(C, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function c_strlen
  end interface

end module treadle_c
