! treadle from Fortran: a toy simulation trains a neural surrogate of its own dynamics between its
! time steps, saves it, reloads it and lets it step the simulation, through treadle's Fortran module.
!
!   fortran_example OUT_DIR
!
! The simulation: BATCH anharmonic oscillators q'' = -(q + C q^3) advanced by semi-implicit Euler
! steps (a = -(q + C q^3), v <- v + DT a, q <- q + DT v), from q = (i - 16.5) / 16 and
! v = (mod(7 (i - 1), 32) - 15.5) / 32, i = 1..BATCH. At every step the surrogate, an MLP built from
! a JSON description, takes one Adam step on the pairs (q_i, v_i) -> a_i: the force the integrator
! needs. Fortran arrays are column-major, so x(2, BATCH) is the row-major (BATCH, 2) tensor the model
! takes, one sample per column, and y(1, BATCH) its (BATCH, 1) output.
!
! Prints the losses, the surrogate's error when it steps the simulation alone, and what errors look
! like; writes OUT_DIR/surrogate.safetensors (Python's tl.load reads it) and OUT_DIR/predict.bin
! (the predictions for the final state, raw float32).
program fortran_example
  use, intrinsic :: iso_c_binding, only: c_double, c_float, c_int
  use, intrinsic :: iso_fortran_env, only: error_unit
  use treadle
  implicit none
  integer, parameter :: BATCH = 32, STEPS = 500, ROLLOUT = 20, SEED = 7
  real(c_double), parameter :: DT = 0.05_c_double, C = 0.5_c_double
  character(len=*), parameter :: MODEL_JSON = &
    '{"format": "treadle-architecture/1", "model": {"type": "Sequential", "layers": [' // &
    '{"type": "Linear", "config": {"in_features": 2, "out_features": 32}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 32, "out_features": 32}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 32, "out_features": 1}}]}}'
  type(treadle_model) :: model, reloaded
  type(treadle_trainer) :: trainer
  real(c_double) :: q(BATCH), v(BATCH), loss
  real(c_float) :: x(2, BATCH), y(1, BATCH), pred(1, BATCH), pred_reloaded(1, BATCH)
  character(len=4096) :: out_dir
  integer :: step, unit

  if (command_argument_count() /= 1) then
    write (error_unit, '(a)') 'usage: fortran_example OUT_DIR'
    stop 2
  end if
  call get_command_argument(1, out_dir)
  print '(2a)', 'treadle ', treadle_version()

  call check(treadle_model_from_json(MODEL_JSON, TREADLE_F32, SEED, model), 'treadle_model_from_json')
  call check(treadle_trainer_create(model, 'mse', 'adam', '{"lr": 0.01}', SEED, trainer), 'treadle_trainer_create')

  ! The host's time loop: one training step on the current state, then the simulation's own step.
  call initial_state(q, v)
  do step = 1, STEPS
    call make_batch(q, v, x, y)
    call check(treadle_trainer_step(trainer, x, y, loss), 'treadle_trainer_step')
    if (step == 1 .or. mod(step, 100) == 0) print '(a, i0, a, es24.16e3)', 'step ', step, ' loss ', loss
    call advance(q, v)
  end do

  ! Save, reload, and check that both predict the same for the final state.
  call check(treadle_model_save(model, trim(out_dir) // '/surrogate.safetensors'), 'treadle_model_save')
  call check(treadle_model_load(trim(out_dir) // '/surrogate.safetensors', reloaded), 'treadle_model_load')
  call make_batch(q, v, x, y)
  call check(treadle_model_predict(model, x, pred), 'treadle_model_predict')
  call check(treadle_model_predict(reloaded, x, pred_reloaded), 'treadle_model_predict')
  if (any(pred /= pred_reloaded)) error stop 'fortran_example: the reloaded model predicts differently'
  print '(a)', 'reloaded model predicts the same'
  open (newunit=unit, file=trim(out_dir) // '/predict.bin', access='stream', form='unformatted', status='replace')
  write (unit) pred
  close (unit)

  print '(a, i0, a, es12.4)', 'surrogate rollout relative error after ', ROLLOUT, ' steps: ', &
    rollout_error(reloaded, q, v)
  call show_errors(reloaded)

  call treadle_trainer_free(trainer)
  call treadle_model_free(model)
  call treadle_model_free(reloaded)
  print '(a)', 'done'

contains

  ! Errors are values: a status (TREADLE_OK = 0 or an error code) and a message.
  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status == TREADLE_OK) return
    write (error_unit, '(a, a, a, i0, 2a)') 'fortran_example: ', what, ' failed (', status, '): ', &
      treadle_error_message()
    error stop 1
  end subroutine check

  subroutine initial_state(q, v)
    real(c_double), intent(out) :: q(:), v(:)
    integer :: i
    do i = 1, size(q)
      q(i) = (i - 16.5_c_double) / 16
      v(i) = (mod(7 * (i - 1), 32) - 15.5_c_double) / 32
    end do
  end subroutine initial_state

  ! The training pairs for the current state: x(:, i) = (q_i, v_i), y(1, i) = a_i.
  subroutine make_batch(q, v, x, y)
    real(c_double), intent(in) :: q(:), v(:)
    real(c_float), intent(out) :: x(:, :), y(:, :)
    real(c_double) :: a(size(q))
    a = -(q + C * q * q * q)
    x(1, :) = real(q, c_float)
    x(2, :) = real(v, c_float)
    y(1, :) = real(a, c_float)
  end subroutine make_batch

  subroutine advance(q, v)
    real(c_double), intent(inout) :: q(:), v(:)
    v = v + DT * (-(q + C * q * q * q))
    q = q + DT * v
  end subroutine advance

  ! The surrogate steps the oscillators alone (its force in the integrator) for ROLLOUT steps
  ! from (q, v), next to the simulation: the relative L2 error of the final state.
  function rollout_error(surrogate, q, v) result(rel_error)
    type(treadle_model), intent(in) :: surrogate
    real(c_double), intent(in) :: q(:), v(:)
    real(c_double) :: rel_error
    real(c_double) :: q_true(size(q)), v_true(size(q)), q_net(size(q)), v_net(size(q))
    real(c_float) :: state(2, size(q)), force(1, size(q))
    integer :: step
    q_true = q
    v_true = v
    q_net = q
    v_net = v
    do step = 1, ROLLOUT
      call advance(q_true, v_true)
      state(1, :) = real(q_net, c_float)
      state(2, :) = real(v_net, c_float)
      call check(treadle_model_predict(surrogate, state, force), 'treadle_model_predict')
      v_net = v_net + DT * real(force(1, :), c_double)
      q_net = q_net + DT * v_net
    end do
    rel_error = sqrt(sum((q_net - q_true)**2 + (v_net - v_true)**2) / sum(q_true**2 + v_true**2))
  end function rollout_error

  ! What mistakes give: the status and the message naming the problem; nothing is changed.
  subroutine show_errors(surrogate)
    type(treadle_model), intent(in) :: surrogate
    real(c_float) :: wide(3, BATCH), out(1, BATCH), transposed(BATCH, 1)
    real(c_double) :: x64(2, BATCH), out64(1, BATCH)
    integer(c_int) :: status
    wide = 0
    x64 = 0
    status = treadle_model_predict(surrogate, wide, out)
    print '(a, i0, 2a)', 'wrong input size: status ', status, ', message: ', treadle_error_message()
    status = treadle_model_predict(surrogate, x64, out64)
    print '(a, i0, 2a)', 'wrong kind: status ', status, ', message: ', treadle_error_message()
    status = treadle_model_predict(surrogate, x, transposed)
    print '(a, i0, 2a)', 'transposed output: status ', status, ', message: ', treadle_error_message()
  end subroutine show_errors

end program fortran_example
