! Online training from Fortran: replay buffers (treadle.h's treadle_replay_*, docs/replay.md) for the
! common case, samples of an input vector and a target vector of one real kind pushed from the host's
! time loop and sampled for training steps, and checkpoints that keep such a buffer. Arrays are (features, samples): column j is sample
! j, contiguous in memory, the row-major (samples, features) layout the C API reads. Other layouts
! (more fields, integer ids) use treadle_c's c_treadle_replay_* directly.
module treadle_online
  use, intrinsic :: iso_c_binding, only: c_char, c_double, c_float, c_int, c_int64_t, c_loc, c_null_char, &
                                         c_null_ptr, c_ptr
  use treadle_c
  use treadle, only: treadle_trainer
  implicit none
  private
  public :: treadle_replay_create, treadle_replay_free, treadle_replay_push, treadle_replay_sample
  public :: treadle_replay_ready, treadle_replay_size
  public :: treadle_trainer_save_checkpoint, treadle_trainer_load_checkpoint

  type, public :: treadle_replay
    type(c_ptr) :: handle = c_null_ptr
    integer(c_int) :: dtype = -1
    integer(c_int64_t) :: n_in = 0, n_out = 0
  end type treadle_replay

  interface treadle_replay_push
    module procedure push_f32, push_f64
  end interface
  interface treadle_replay_sample
    module procedure sample_f32, sample_f64
  end interface

  ! The fields' names as C strings: "x" (the input) and "y" (the target).
  character(kind=c_char), target, save :: field_names(4) = [character(kind=c_char) :: 'x', c_null_char, 'y', c_null_char]
  ! The name a checkpoint keeps the buffer under.
  character(kind=c_char), target, save :: checkpoint_name(7) = &
    [character(kind=c_char) :: 'r', 'e', 'p', 'l', 'a', 'y', c_null_char]

contains

  ! A buffer of `capacity` samples, each an input of n_in and a target of n_out values of `dtype`
  ! (TREADLE_F32 or TREADLE_F64). policy: 'fifo', 'firo' or 'reservoir'; min_size: the watermark;
  ! max_reuse: uses before a sample leaves (-1 the policy's default, 0 never); seed: of its draws.
  function treadle_replay_create(buffer, policy, capacity, n_in, n_out, dtype, min_size, max_reuse, seed) &
      result(status)
    type(treadle_replay), intent(out) :: buffer
    character(len=*), intent(in) :: policy
    integer, intent(in) :: capacity, n_in, n_out
    integer(c_int), intent(in) :: dtype
    integer, intent(in), optional :: min_size, max_reuse, seed
    integer(c_int) :: status
    type(c_ptr) :: names(2)
    integer(c_int) :: ndims(2), dtypes(2)
    integer(c_int64_t) :: shapes(2), low, reuse, draws
    low = 0
    reuse = -1
    draws = 0
    if (present(min_size)) low = int(min_size, c_int64_t)
    if (present(max_reuse)) reuse = int(max_reuse, c_int64_t)
    if (present(seed)) draws = int(seed, c_int64_t)
    names = [c_loc(field_names(1)), c_loc(field_names(3))]
    ndims = 1
    shapes = [int(n_in, c_int64_t), int(n_out, c_int64_t)]
    dtypes = dtype
    status = c_treadle_replay_create(trim(policy) // c_null_char, int(capacity, c_int64_t), low, reuse, draws, 2_c_int, &
                                     names, ndims, shapes, dtypes, buffer%handle)
    if (status == TREADLE_OK) then
      buffer%dtype = dtype
      buffer%n_in = shapes(1)
      buffer%n_out = shapes(2)
    end if
  end function treadle_replay_create

  subroutine treadle_replay_free(buffer)
    type(treadle_replay), intent(inout) :: buffer
    call c_treadle_replay_free(buffer%handle)
    buffer%handle = c_null_ptr
  end subroutine treadle_replay_free

  ! TREADLE_OK, or the C API's error naming what does not fit: kind, feature counts, sample counts.
  function check_arrays(buffer, kind, x_rows, y_rows, x_cols, y_cols, who) result(status)
    type(treadle_replay), intent(in) :: buffer
    integer(c_int), intent(in) :: kind
    integer, intent(in) :: x_rows, y_rows, x_cols, y_cols
    character(len=*), intent(in) :: who
    integer(c_int) :: status
    character(len=160) :: message
    status = TREADLE_OK
    if (buffer%dtype /= kind) then
      status = c_treadle_set_last_error(TREADLE_ERROR_TYPE, who // ": the arrays' real kind is not the buffer's dtype" &
                                        // c_null_char)
    else if (x_rows /= buffer%n_in .or. y_rows /= buffer%n_out .or. x_cols /= y_cols) then
      write (message, '(a, ": x(", i0, ", ", i0, ") and y(", i0, ", ", i0, ") for inputs of ", i0, " and targets of ", i0)') &
        who, x_rows, x_cols, y_rows, y_cols, buffer%n_in, buffer%n_out
      status = c_treadle_set_last_error(TREADLE_ERROR_ARGUMENT, trim(message) // c_null_char)
    end if
  end function check_arrays

  ! Copies the samples x(:, j), y(:, j), j = 1..size(x, 2), into the buffer.
  function push_f32(buffer, x, y) result(status)
    type(treadle_replay), intent(in) :: buffer
    real(c_float), intent(in), contiguous, target :: x(:, :), y(:, :)
    integer(c_int) :: status
    status = check_arrays(buffer, TREADLE_F32, size(x, 1), size(y, 1), size(x, 2), size(y, 2), "treadle_replay_push")
    if (status == TREADLE_OK) &
      status = c_treadle_replay_push(buffer%handle, int(size(x, 2), c_int64_t), [c_loc(x), c_loc(y)])
  end function push_f32

  function push_f64(buffer, x, y) result(status)
    type(treadle_replay), intent(in) :: buffer
    real(c_double), intent(in), contiguous, target :: x(:, :), y(:, :)
    integer(c_int) :: status
    status = check_arrays(buffer, TREADLE_F64, size(x, 1), size(y, 1), size(x, 2), size(y, 2), "treadle_replay_push")
    if (status == TREADLE_OK) &
      status = c_treadle_replay_push(buffer%handle, int(size(x, 2), c_int64_t), [c_loc(x), c_loc(y)])
  end function push_f64

  ! Fills x(:, j), y(:, j) with size(x, 2) samples by the buffer's policy; TREADLE_ERROR_VALUE below
  ! the watermark, with nothing changed.
  function sample_f32(buffer, x, y) result(status)
    type(treadle_replay), intent(in) :: buffer
    real(c_float), intent(inout), contiguous, target :: x(:, :), y(:, :)
    integer(c_int) :: status
    status = check_arrays(buffer, TREADLE_F32, size(x, 1), size(y, 1), size(x, 2), size(y, 2), "treadle_replay_sample")
    if (status == TREADLE_OK) &
      status = c_treadle_replay_sample(buffer%handle, int(size(x, 2), c_int64_t), [c_loc(x), c_loc(y)])
  end function sample_f32

  function sample_f64(buffer, x, y) result(status)
    type(treadle_replay), intent(in) :: buffer
    real(c_double), intent(inout), contiguous, target :: x(:, :), y(:, :)
    integer(c_int) :: status
    status = check_arrays(buffer, TREADLE_F64, size(x, 1), size(y, 1), size(x, 2), size(y, 2), "treadle_replay_sample")
    if (status == TREADLE_OK) &
      status = c_treadle_replay_sample(buffer%handle, int(size(x, 2), c_int64_t), [c_loc(x), c_loc(y)])
  end function sample_f64

  ! Whether a batch of batch_size may be sampled (the watermark and the batch are held).
  logical function treadle_replay_ready(buffer, batch_size)
    type(treadle_replay), intent(in) :: buffer
    integer, intent(in) :: batch_size
    integer(c_int) :: ready
    ready = 0
    if (c_treadle_replay_ready(buffer%handle, int(batch_size, c_int64_t), ready) /= TREADLE_OK) ready = 0
    treadle_replay_ready = ready /= 0
  end function treadle_replay_ready

  integer(c_int64_t) function treadle_replay_size(buffer)
    type(treadle_replay), intent(in) :: buffer
    treadle_replay_size = -1
    if (c_treadle_replay_size(buffer%handle, treadle_replay_size) /= TREADLE_OK) treadle_replay_size = -1
  end function treadle_replay_size

  ! A training checkpoint of `trainer`, with `buffer` (optional) saved next to it under "replay".
  function treadle_trainer_save_checkpoint(trainer, path, buffer) result(status)
    type(treadle_trainer), intent(in) :: trainer
    character(len=*), intent(in) :: path
    type(treadle_replay), intent(in), optional :: buffer
    integer(c_int) :: status
    if (present(buffer)) then
      status = c_treadle_trainer_save_checkpoint(trainer%handle, trim(path) // c_null_char, 1_c_int, &
                                                 [c_loc(checkpoint_name(1))], [buffer%handle])
    else
      status = c_treadle_trainer_save_checkpoint(trainer%handle, trim(path) // c_null_char, 0_c_int, [c_null_ptr], &
                                                 [c_null_ptr])
    end if
  end function treadle_trainer_save_checkpoint

  ! Restores a checkpoint into `trainer` and `buffer` (optional); everything is checked first.
  function treadle_trainer_load_checkpoint(trainer, path, buffer) result(status)
    type(treadle_trainer), intent(in) :: trainer
    character(len=*), intent(in) :: path
    type(treadle_replay), intent(in), optional :: buffer
    integer(c_int) :: status
    if (present(buffer)) then
      status = c_treadle_trainer_load_checkpoint(trainer%handle, trim(path) // c_null_char, 1_c_int, &
                                                 [c_loc(checkpoint_name(1))], [buffer%handle])
    else
      status = c_treadle_trainer_load_checkpoint(trainer%handle, trim(path) // c_null_char, 0_c_int, [c_null_ptr], &
                                                 [c_null_ptr])
    end if
  end function treadle_trainer_load_checkpoint

end module treadle_online
