! Online training from a Fortran time loop: an ensemble of heat-equation runs pushes its samples into a
! treadle replay buffer between time steps, and a surrogate trains on batches sampled from it; halfway the
! program checkpoints the trainer with the buffer, and at the end resumes from that checkpoint to show
! that the resumed run repeats the uninterrupted one bit for bit.
!
!   fortran_online OUT_DIR
!
! The simulation (examples/heat_surrogate.py's problem, small): RUNS periodic 1-D heat equations on NX
! points, u <- u + r ((u(i+1) - 2 u(i)) + u(i-1)), SUBSTEPS explicit steps per coarse step, each run with
! its own diffusion number r in [R_LOW, R_HIGH]; a run restarts from a fresh initial condition after
! EPISODE coarse steps (staggered). Initial conditions are uniform values in [-1, 1] from a Park-Miller
! generator (integer arithmetic: any language draws the same numbers), smoothed by SMOOTH steps at r = 1/4.
! A sample is the state and the scaled diffusion number (NX + 1 float32 values) and its target
! SCALE * (change over one coarse step) (NX values). Arrays are (features, samples): x(:, j) is sample j,
! the row-major (samples, features) layout of the C API.
!
! Prints the losses (17 digits), the held-out rollout error and the resume check; writes
! OUT_DIR/online.treadle (the halfway checkpoint) and OUT_DIR/predict.bin (predictions for the final
! states, raw float32).
program fortran_online
  use, intrinsic :: iso_c_binding, only: c_double, c_float, c_int, c_int64_t
  use, intrinsic :: iso_fortran_env, only: error_unit, int64
  use treadle
  use treadle_online
  implicit none
  integer, parameter :: NX = 16, RUNS = 8, SUBSTEPS = 4, EPISODE = 16, SMOOTH = 8
  integer, parameter :: STEPS = 2000, CHECKPOINT = 1000, BATCH = 32, CAPACITY = 1024, WATERMARK = 64
  integer, parameter :: SEED = 11
  real(c_double), parameter :: R_LOW = 0.05_c_double, R_HIGH = 0.45_c_double, SCALE = 10
  character(len=*), parameter :: MODEL_JSON = &
    '{"format": "treadle-architecture/1", "model": {"type": "Sequential", "layers": [' // &
    '{"type": "Linear", "config": {"in_features": 17, "out_features": 64}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 64, "out_features": 64}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 64, "out_features": 16}}]}}'

  ! The ensemble's whole state: what a checkpoint of the host keeps next to treadle's.
  type :: ensemble
    real(c_double) :: u(NX, RUNS), r(RUNS)
    integer :: age(RUNS)
    integer(int64) :: draws
  end type ensemble

  type(ensemble) :: sim, at_checkpoint
  type(treadle_model) :: model
  type(treadle_trainer) :: trainer
  type(treadle_replay) :: buffer
  real(c_double) :: losses(STEPS)
  real(c_float) :: pred(NX, RUNS), pred_resumed(NX, RUNS)
  character(len=4096) :: out_dir
  integer :: unit, j

  if (command_argument_count() /= 1) then
    write (error_unit, '(a)') 'usage: fortran_online OUT_DIR'
    stop 2
  end if
  call get_command_argument(1, out_dir)

  ! The uninterrupted run, saving a checkpoint (trainer and buffer) after step CHECKPOINT.
  call start(model, trainer, buffer)
  sim%draws = SEED
  call restart_runs(sim, [(.true., j = 1, RUNS)])
  sim%age = [(mod(3 * (j - 1), EPISODE), j = 1, RUNS)]  ! staggered restarts
  call run(sim, 1, STEPS, .true.)
  call check(treadle_model_predict(model, features(sim), pred), 'treadle_model_predict')
  print '(a, es12.4)', 'held-out rollout relative L2 error: ', held_out_error(model)
  open (newunit=unit, file=trim(out_dir) // '/predict.bin', access='stream', form='unformatted', status='replace')
  write (unit) pred
  close (unit)
  call finish(model, trainer, buffer)

  ! A new process would do this: fresh objects, the checkpoint loaded, the host's own state restored.
  call start(model, trainer, buffer)
  call check(treadle_trainer_load_checkpoint(trainer, trim(out_dir) // '/online.treadle', buffer), &
             'treadle_trainer_load_checkpoint')
  sim = at_checkpoint
  call run(sim, CHECKPOINT + 1, STEPS, .false.)
  call check(treadle_model_predict(model, features(sim), pred_resumed), 'treadle_model_predict')
  if (any(pred_resumed /= pred)) error stop 'fortran_online: the resumed run predicts differently'
  print '(a)', 'resumed run equals the uninterrupted one bit for bit'
  call finish(model, trainer, buffer)
  print '(a)', 'done'

contains

  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status == TREADLE_OK) return
    write (error_unit, '(a, a, a, i0, 2a)') 'fortran_online: ', what, ' failed (', status, '): ', &
      treadle_error_message()
    error stop 1
  end subroutine check

  subroutine start(model, trainer, buffer)
    type(treadle_model), intent(out) :: model
    type(treadle_trainer), intent(out) :: trainer
    type(treadle_replay), intent(out) :: buffer
    call check(treadle_model_from_json(MODEL_JSON, TREADLE_F32, SEED, model), 'treadle_model_from_json')
    call check(treadle_trainer_create(model, 'mse', 'adam', '{"lr": 0.003}', SEED, trainer), 'treadle_trainer_create')
    call check(treadle_replay_create(buffer, 'firo', CAPACITY, NX + 1, NX, TREADLE_F32, min_size=WATERMARK, &
                                     max_reuse=0, seed=SEED), 'treadle_replay_create')
  end subroutine start

  subroutine finish(model, trainer, buffer)
    type(treadle_model), intent(inout) :: model
    type(treadle_trainer), intent(inout) :: trainer
    type(treadle_replay), intent(inout) :: buffer
    call treadle_replay_free(buffer)
    call treadle_trainer_free(trainer)
    call treadle_model_free(model)
  end subroutine finish

  ! Coarse steps first..last of the host's time loop. Each: the simulation's step, its samples pushed,
  ! one training step on a sampled batch once the buffer holds its watermark, restarts of old runs.
  ! The uninterrupted run (first = 1) records the losses and checkpoints; the resumed one compares.
  subroutine run(sim, first, last, uninterrupted)
    type(ensemble), intent(inout) :: sim
    integer, intent(in) :: first, last
    logical, intent(in) :: uninterrupted
    real(c_double) :: u_next(NX, RUNS), loss
    real(c_float) :: y(NX, RUNS), bx(NX + 1, BATCH), by(NX, BATCH)
    integer :: step
    do step = first, last
      u_next = coarse_step(sim%u, sim%r)
      y = real((u_next - sim%u) * SCALE, c_float)
      call check(treadle_replay_push(buffer, features(sim), y), 'treadle_replay_push')
      loss = -1
      if (treadle_replay_ready(buffer, BATCH)) then
        call check(treadle_replay_sample(buffer, bx, by), 'treadle_replay_sample')
        call check(treadle_trainer_step(trainer, bx, by, loss), 'treadle_trainer_step')
      end if
      if (uninterrupted) then
        losses(step) = loss
        if (mod(step, 250) == 0) print '(a, i0, a, es24.16e3)', 'step ', step, ' loss ', loss
      else if (loss /= losses(step)) then
        write (error_unit, '(a, i0, 2(a, es24.16e3))') 'fortran_online: resumed step ', step, ' loss ', loss, &
          ' differs from ', losses(step)
        error stop 1
      end if
      sim%u = u_next
      sim%age = sim%age + 1
      call restart_runs(sim, sim%age >= EPISODE)
      if (uninterrupted .and. step == CHECKPOINT) then
        call check(treadle_trainer_save_checkpoint(trainer, trim(out_dir) // '/online.treadle', buffer), &
                   'treadle_trainer_save_checkpoint')
        at_checkpoint = sim
      end if
    end do
  end subroutine run

  function coarse_step(u, r) result(v)
    real(c_double), intent(in) :: u(:, :), r(:)
    real(c_double) :: v(size(u, 1), size(u, 2))
    integer :: j
    v = u
    do j = 1, size(u, 2)
      call diffuse(v(:, j), r(j), SUBSTEPS)
    end do
  end function coarse_step

  ! `steps` explicit steps of the periodic heat equation with diffusion number r.
  subroutine diffuse(u, r, steps)
    real(c_double), intent(inout) :: u(:)
    real(c_double), intent(in) :: r
    integer, intent(in) :: steps
    real(c_double) :: old(size(u))
    integer :: i, n, step
    n = size(u)
    do step = 1, steps
      old = u
      do i = 1, n
        u(i) = old(i) + r * ((old(modulo(i, n) + 1) - 2 * old(i)) + old(modulo(i - 2, n) + 1))
      end do
    end do
  end subroutine diffuse

  ! Park-Miller's minimal standard generator: the next draw in (0, 1).
  real(c_double) function uniform(draws)
    integer(int64), intent(inout) :: draws
    draws = mod(16807_int64 * draws, 2147483647_int64)
    uniform = real(draws, c_double) / 2147483647
  end function uniform

  ! New initial conditions (NX draws, then r) for the runs marked, in run order; their age is reset.
  subroutine restart_runs(sim, marked)
    type(ensemble), intent(inout) :: sim
    logical, intent(in) :: marked(:)
    integer :: i, j
    do j = 1, RUNS
      if (.not. marked(j)) cycle
      do i = 1, NX
        sim%u(i, j) = 2 * uniform(sim%draws) - 1
      end do
      call diffuse(sim%u(:, j), 0.25_c_double, SMOOTH)
      sim%r(j) = R_LOW + (R_HIGH - R_LOW) * uniform(sim%draws)
      sim%age(j) = 0
    end do
  end subroutine restart_runs

  ! The network's inputs: each run's state and its diffusion number scaled to [-1, 1].
  function features(sim) result(x)
    type(ensemble), intent(in) :: sim
    real(c_float) :: x(NX + 1, RUNS)
    x(1:NX, :) = real(sim%u, c_float)
    x(NX + 1, :) = real(2 * (sim%r - R_LOW) / (R_HIGH - R_LOW) - 1, c_float)
  end function features

  ! Fresh runs (their own generator), the surrogate rolled out for EPISODE coarse steps next to the
  ! simulation: the relative L2 error of the whole rollout.
  real(c_double) function held_out_error(model)
    type(treadle_model), intent(in) :: model
    type(ensemble) :: truth, surrogate
    real(c_float) :: change(NX, RUNS)
    real(c_double) :: err2, ref2
    integer :: step
    truth%draws = 4242
    call restart_runs(truth, [(.true., step = 1, RUNS)])
    surrogate = truth
    err2 = 0
    ref2 = 0
    do step = 1, EPISODE
      truth%u = coarse_step(truth%u, truth%r)
      call check(treadle_model_predict(model, features(surrogate), change), 'treadle_model_predict')
      surrogate%u = surrogate%u + real(change, c_double) / SCALE
      err2 = err2 + sum((surrogate%u - truth%u)**2)
      ref2 = ref2 + sum(truth%u**2)
    end do
    held_out_error = sqrt(err2 / ref2)
  end function held_out_error

end program fortran_online
