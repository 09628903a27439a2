! Data-parallel training from a Fortran MPI program (treadle/treadle_distributed.h, library
! treadle::distributed): the host's communicator goes in as the INTEGER handle Fortran holds (MPI_Fint):
! a communicator of `use mpi`, or comm%MPI_VAL of mpi_f08's TYPE(MPI_Comm). Sub-communicators are
! welcome; treadle never initialises MPI, and the MPI library must be the one treadle::distributed was
! built with (another one is refused with TREADLE_ERROR_VALUE, naming both).
!
! Every call except treadle_data_parallel_free is collective over the communicator: all its ranks call
! it, in the same order. An error on one rank (arrays of the wrong shape, a model error) is reported on
! every rank with the same message and no rank updates, so no rank waits for another that gave up.
!
!   type(treadle_data_parallel) :: dp
!   status = treadle_data_parallel_create(dp, trainer, comm)      ! root 0's weights go to every rank
!   status = treadle_data_parallel_step(dp, x, y, loss)          ! this rank's shard; loss is global
!
! Arrays are as treadle_trainer_step takes them: x(features, local_batch), y(outputs, local_batch) (or
! class indices y(local_batch) of integer(c_int64_t)); shards may differ in size between ranks.
module treadle_distributed
  use, intrinsic :: iso_c_binding, only: c_char, c_double, c_float, c_int, c_int64_t, c_loc, c_null_char, &
                                         c_null_ptr, c_ptr
  use treadle, only: treadle_trainer, treadle_check_step_kinds, treadle_error_message, TREADLE_OK, TREADLE_F32, &
                     TREADLE_F64
  use treadle_c, only: TREADLE_I64
  implicit none
  private
  public :: treadle_data_parallel_create, treadle_data_parallel_free, treadle_data_parallel_step
  public :: treadle_data_parallel_divergence, treadle_data_parallel_rank

  type, public :: treadle_data_parallel
    type(c_ptr) :: handle = c_null_ptr
    type(treadle_trainer) :: trainer  ! the trainer it steps (a copy of the handle), for the kind checks
  end type treadle_data_parallel

  interface treadle_data_parallel_step
    module procedure step_f32, step_f64, step_f32_i64, step_f64_i64
  end interface

  interface
    function c_create_f(trainer, comm, root, buffers, out) result(status) &
        bind(C, name="treadle_data_parallel_create_f")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: trainer
      integer(c_int), value :: comm, root  ! comm: MPI_Fint, a C int in every MPI
      character(kind=c_char), dimension(*), intent(in) :: buffers
      type(c_ptr), intent(out) :: out
      integer(c_int) :: status
    end function c_create_f

    subroutine c_free(dp) bind(C, name="treadle_data_parallel_free")
      import :: c_ptr
      type(c_ptr), value :: dp
    end subroutine c_free

    function c_step(dp, x, x_ndim, x_shape, y, y_ndim, y_shape, loss) result(status) &
        bind(C, name="treadle_data_parallel_step")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: dp, x, y, loss
      integer(c_int), value :: x_ndim, y_ndim
      integer(c_int64_t), dimension(*), intent(in) :: x_shape, y_shape
      integer(c_int) :: status
    end function c_step

    function c_set_timeout(dp, seconds) result(status) bind(C, name="treadle_data_parallel_set_timeout")
      import :: c_double, c_int, c_ptr
      type(c_ptr), value :: dp
      real(c_double), value :: seconds
      integer(c_int) :: status
    end function c_set_timeout

    function c_fail(dp, error) result(status) bind(C, name="treadle_data_parallel_fail")
      import :: c_char, c_int, c_ptr
      type(c_ptr), value :: dp
      character(kind=c_char), dimension(*), intent(in) :: error
      integer(c_int) :: status
    end function c_fail

    function c_divergence(dp, divergence) result(status) bind(C, name="treadle_data_parallel_divergence")
      import :: c_double, c_int, c_ptr
      type(c_ptr), value :: dp
      real(c_double), intent(out) :: divergence
      integer(c_int) :: status
    end function c_divergence

    function c_rank(dp, rank, size) result(status) bind(C, name="treadle_data_parallel_rank")
      import :: c_int, c_ptr
      type(c_ptr), value :: dp
      integer(c_int), intent(out) :: rank, size
      integer(c_int) :: status
    end function c_rank
  end interface

contains

  ! Collective over comm. root (default 0): the rank whose weights and optimizer state every rank
  ! starts from. buffers (default 'root'): non-trained state such as BatchNorm's running statistics
  ! after each step, 'root', 'average' or 'local'. timeout (seconds, default none): how long each step
  ! waits for every rank to arrive before it returns TREADLE_ERROR_TIMEOUT (a rank that left early);
  ! dp is unusable after that and the host should end the job (MPI_Abort). trainer and comm must
  ! outlive dp.
  function treadle_data_parallel_create(dp, trainer, comm, root, buffers, timeout) result(status)
    type(treadle_data_parallel), intent(out) :: dp
    type(treadle_trainer), intent(in) :: trainer
    integer, intent(in) :: comm
    integer, intent(in), optional :: root
    character(len=*), intent(in), optional :: buffers
    real(c_double), intent(in), optional :: timeout
    integer(c_int) :: status
    integer(c_int) :: root_rank
    character(len=:), allocatable :: mode
    root_rank = 0
    if (present(root)) root_rank = int(root, c_int)
    mode = 'root'
    if (present(buffers)) mode = trim(buffers)
    status = c_create_f(trainer%handle, int(comm, c_int), root_rank, mode // c_null_char, dp%handle)
    if (status == TREADLE_OK) dp%trainer = trainer
    if (status == TREADLE_OK .and. present(timeout)) status = c_set_timeout(dp%handle, timeout)
  end function treadle_data_parallel_create

  subroutine treadle_data_parallel_free(dp)
    type(treadle_data_parallel), intent(inout) :: dp
    call c_free(dp%handle)
    dp%handle = c_null_ptr
  end subroutine treadle_data_parallel_free

  ! Collective: the largest |p - p_root| over all parameters and ranks (0 when the replicas agree).
  function treadle_data_parallel_divergence(dp, divergence) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    real(c_double), intent(out) :: divergence
    integer(c_int) :: status
    status = c_divergence(dp%handle, divergence)
  end function treadle_data_parallel_divergence

  ! This rank in the communicator (from 0) and the communicator's size.
  function treadle_data_parallel_rank(dp, rank, size) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    integer, intent(out) :: rank, size
    integer(c_int) :: status, r, n
    status = c_rank(dp%handle, r, n)
    rank = r
    size = n
  end function treadle_data_parallel_rank

  function step_f32(dp, x, y, loss) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    real(c_float), dimension(..), contiguous, target, intent(in) :: x, y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(dp, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), TREADLE_F32, c_loc(y), &
                      shape(y, kind=c_int64_t), loss)
  end function step_f32

  function step_f64(dp, x, y, loss) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    real(c_double), dimension(..), contiguous, target, intent(in) :: x, y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(dp, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), TREADLE_F64, c_loc(y), &
                      shape(y, kind=c_int64_t), loss)
  end function step_f64

  function step_f32_i64(dp, x, y, loss) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    real(c_float), dimension(..), contiguous, target, intent(in) :: x
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(dp, TREADLE_F32, c_loc(x), shape(x, kind=c_int64_t), TREADLE_I64, c_loc(y), &
                      shape(y, kind=c_int64_t), loss)
  end function step_f32_i64

  function step_f64_i64(dp, x, y, loss) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    real(c_double), dimension(..), contiguous, target, intent(in) :: x
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: y
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status
    status = run_step(dp, TREADLE_F64, c_loc(x), shape(x, kind=c_int64_t), TREADLE_I64, c_loc(y), &
                      shape(y, kind=c_int64_t), loss)
  end function step_f64_i64

  ! A rank whose arrays have the wrong kind still takes part in the step, as a failing rank
  ! (treadle_data_parallel_fail), so every rank reports the kind error instead of waiting for this one.
  function run_step(dp, x_kind, x, x_shape, y_kind, y, y_shape, loss) result(status)
    type(treadle_data_parallel), intent(in) :: dp
    integer(c_int), intent(in) :: x_kind, y_kind
    type(c_ptr), intent(in) :: x, y
    integer(c_int64_t), intent(in) :: x_shape(:), y_shape(:)
    real(c_double), intent(out), optional, target :: loss
    integer(c_int) :: status, kinds
    type(c_ptr) :: loss_ptr
    loss_ptr = c_null_ptr
    if (present(loss)) loss_ptr = c_loc(loss)
    kinds = treadle_check_step_kinds('treadle_data_parallel_step', dp%trainer, x_kind, y_kind)
    if (kinds /= TREADLE_OK) then
      status = c_fail(dp%handle, c_string(treadle_error_message()))
      return
    end if
    ! Shapes reversed: a Fortran array (d1, ..., dn) is the row-major tensor (dn, ..., d1).
    status = c_step(dp%handle, x, size(x_shape, kind=c_int), x_shape(size(x_shape):1:-1), &
                    y, size(y_shape, kind=c_int), y_shape(size(y_shape):1:-1), loss_ptr)
  end function run_step

  function c_string(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=:), allocatable :: c
    c = s // c_null_char
  end function c_string

end module treadle_distributed
