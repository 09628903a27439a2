! Data-parallel training from a Fortran MPI program (module treadle_distributed). The same run as
! data_parallel.c and data_parallel.py in this directory, bit for bit:
!
!   mpiexec -n 3 ./fortran_data_parallel OUT_DIR
!
! The host owns MPI: it initialises it, splits MPI_COMM_WORLD into groups of two ranks (a last odd rank
! is a group of one) and lends each group's communicator, the INTEGER handle `use mpi` gives (with
! mpi_f08, pass comm%MPI_VAL), to treadle, which trains one model per group. Every rank builds the same
! data set (a Park-Miller generator: integer arithmetic, the same numbers in any language): N samples
! x in [-2, 2]^3, y = x1 x2 - x3^2 / 2 + x1 / 4. Step s trains on the global batch of rows
! (s B + k) mod N, k = 0..B-1, split over the group's ranks in order. The group's rank 0 prints its
! losses and writes its final parameters to OUT_DIR/params_group<G>.bin (raw float32).
program fortran_data_parallel
  use, intrinsic :: iso_c_binding, only: c_double, c_float, c_int, c_int64_t
  use, intrinsic :: iso_fortran_env, only: error_unit, int64
  use mpi
  use treadle
  use treadle_distributed
  implicit none
  integer, parameter :: N = 256, FEATURES = 3, B = 24, STEPS = 60, SEED = 3
  character(len=*), parameter :: MODEL_JSON = &
    '{"format": "treadle-architecture/1", "model": {"type": "Sequential", "layers": [' // &
    '{"type": "Linear", "config": {"in_features": 3, "out_features": 32}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 32, "out_features": 32}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 32, "out_features": 1}}]}}'
  type(treadle_model) :: model
  type(treadle_trainer) :: trainer
  type(treadle_data_parallel) :: dp
  real(c_float) :: x(FEATURES, N), y(1, N)
  real(c_float), allocatable :: xs(:, :), ys(:, :), params(:)
  real(c_double) :: loss, divergence
  integer(c_int64_t) :: n_params
  character(len=4096) :: out_dir, path
  integer :: ierr, world_rank, group, comm, group_rank, group_size, count, first, step, k, unit

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, world_rank, ierr)
  if (command_argument_count() /= 1) then
    if (world_rank == 0) write (error_unit, '(a)') 'usage: fortran_data_parallel OUT_DIR'
    call MPI_Finalize(ierr)
    stop 2
  end if
  call get_command_argument(1, out_dir)
  group = world_rank / 2
  call MPI_Comm_split(MPI_COMM_WORLD, group, world_rank, comm, ierr)

  call make_data(x, y)
  call check(treadle_model_from_json(MODEL_JSON, TREADLE_F32, SEED, model), 'treadle_model_from_json')
  call check(treadle_trainer_create(model, 'mse', 'adam', '{"lr": 0.01}', SEED, trainer), 'treadle_trainer_create')
  ! timeout: a rank that leaves early makes the others' step fail after 10 minutes, not wait forever.
  call check(treadle_data_parallel_create(dp, trainer, comm, timeout=600.0_c_double), 'treadle_data_parallel_create')
  call check(treadle_data_parallel_rank(dp, group_rank, group_size), 'treadle_data_parallel_rank')

  ! This rank's rows of each global batch (the first mod(B, size) ranks take one more).
  count = B / group_size
  first = group_rank * count + min(group_rank, mod(B, group_size))
  if (group_rank < mod(B, group_size)) count = count + 1
  allocate (xs(FEATURES, count), ys(1, count))
  do step = 0, STEPS - 1
    do k = 1, count
      xs(:, k) = x(:, mod(step * B + first + k - 1, N) + 1)
      ys(:, k) = y(:, mod(step * B + first + k - 1, N) + 1)
    end do
    call check(treadle_data_parallel_step(dp, xs, ys, loss), 'treadle_data_parallel_step')
    if (group_rank == 0 .and. mod(step + 1, 10) == 0) print '(a, i0, a, i0, a, es24.16e3)', 'group ', group, &
      ' step ', step + 1, ' loss ', loss
  end do

  call check(treadle_data_parallel_divergence(dp, divergence), 'treadle_data_parallel_divergence')
  call check(treadle_model_num_parameters(model, n_params), 'treadle_model_num_parameters')
  allocate (params(n_params))
  call check(treadle_model_get_parameters(model, params), 'treadle_model_get_parameters')
  if (group_rank == 0) then
    write (path, '(a, a, i0, a)') trim(out_dir), '/params_group', group, '.bin'
    open (newunit=unit, file=trim(path), access='stream', form='unformatted', status='replace')
    write (unit) params
    close (unit)
    print '(a, i0, a, i0, a, g0)', 'group ', group, ' of ', group_size, ' ranks: replicas differ by ', divergence
  end if
  call show_errors()

  call treadle_data_parallel_free(dp)
  call treadle_trainer_free(trainer)
  call treadle_model_free(model)
  call MPI_Comm_free(comm, ierr)
  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  call MPI_Finalize(ierr)

contains

  ! A failed call ends the job: the ranks of a collective that failed here got the same status and
  ! message, but other groups would wait at the final barrier.
  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    integer :: abort_error
    if (status == TREADLE_OK) return
    write (error_unit, '(a, a, a, i0, 2a)') 'fortran_data_parallel: ', what, ' failed (', status, '): ', &
      treadle_error_message()
    call MPI_Abort(MPI_COMM_WORLD, 1, abort_error)
  end subroutine check

  subroutine make_data(x, y)
    real(c_float), intent(out) :: x(:, :), y(:, :)
    real(c_double) :: v(FEATURES)
    integer(int64) :: draws
    integer :: i, j
    draws = 12345
    do i = 1, N
      do j = 1, FEATURES
        draws = mod(16807_int64 * draws, 2147483647_int64)
        v(j) = 4 * (real(draws, c_double) / 2147483647) - 2
        x(j, i) = real(v(j), c_float)
      end do
      y(1, i) = real(v(1) * v(2) - v(3) * v(3) / 2 + v(1) / 4, c_float)
    end do
  end subroutine make_data

  ! A mistake on one rank is reported on every rank of the group, and nothing changes: here the last
  ! rank of each group passes arrays of the wrong kind, the others good ones.
  subroutine show_errors()
    real(c_double) :: wrong(FEATURES, 1), wrong_y(1, 1)
    real(c_float), allocatable :: after(:)
    character(len=:), allocatable :: message
    integer(c_int) :: status
    allocate (after(size(params)))
    wrong = 0
    wrong_y = 0
    if (group_rank == group_size - 1) then
      status = treadle_data_parallel_step(dp, wrong, wrong_y, loss)
    else
      status = treadle_data_parallel_step(dp, xs, ys, loss)
    end if
    message = treadle_error_message()
    call check(treadle_model_get_parameters(model, after), 'treadle_model_get_parameters')
    print '(a, i0, a, i0, a, i0, a, l1, 2a)', 'group ', group, ' rank ', group_rank, ': status ', status, &
      ', parameters unchanged ', all(after == params), ', message: ', message
  end subroutine show_errors

end program fortran_data_parallel
