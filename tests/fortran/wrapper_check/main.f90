! The Fortran wrappers examples/fortran does not use: float64 models, parameters in and out,
! host-driven forward/backward/update, evaluate, class-index targets, load_weights, array sections,
! and the errors of each. Prints "ok: <check>" per check and "FAIL: <check>: <detail>" otherwise.
! Each call is a statement of its own: Fortran may evaluate the operands of an expression in any
! order (and both operands of .and.), so a message is read only after the call that set it.
program wrapper_check
  use, intrinsic :: iso_c_binding, only: c_double, c_float, c_int, c_int64_t
  use treadle
  use treadle_c, only: c_treadle_version
  use treadle_online
  implicit none
  character(len=*), parameter :: MLP = '{"type": "Sequential", "layers": [' // &
    '{"type": "Linear", "config": {"in_features": 3, "out_features": 5}}, {"type": "Tanh"}, ' // &
    '{"type": "Linear", "config": {"in_features": 5, "out_features": 2}}]}'
  integer :: failures = 0
  integer(c_int) :: status

  call check_basics()
  call check_phases()
  call check_evaluate_and_files()
  call check_class_indices()
  call check_sections()
  call check_plan_settings()
  call check_verify()
  call check_replay()
  if (failures > 0) error stop 1
  print '(a)', 'all checks done'

contains

  subroutine expect(ok, name, detail)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: name
    character(len=*), intent(in), optional :: detail
    if (ok) then
      print '(2a)', 'ok: ', name
    else
      failures = failures + 1
      if (present(detail)) then
        print '(4a)', 'FAIL: ', name, ': ', detail
      else
        print '(3a)', 'FAIL: ', name, ': ', treadle_error_message()
      end if
    end if
  end subroutine expect

  ! A float64 model: version, dtype, shapes, parameters in and out, a null handle.
  subroutine check_basics()
    type(treadle_model) :: model, never_created
    integer(c_int) :: dtype, ndim
    integer(c_int64_t) :: n, out_shape(4)
    real(c_double), allocatable :: params(:), back(:)
    real(c_float), allocatable :: back32(:)
    real(c_double) :: x(3, 4), y(2, 4)
    integer :: i
    call expect(len(treadle_version()) > 0 .and. c_associated_version(), 'version')
    call expect(treadle_model_from_json(MLP, TREADLE_F64, 3, model) == TREADLE_OK, 'from_json float64')
    status = treadle_model_dtype(model, dtype)
    call expect(status == TREADLE_OK .and. dtype == TREADLE_F64, 'dtype')
    call expect(treadle_error_message() == '', 'no message after a success')
    status = treadle_model_output_shape(model, [3_c_int64_t, 4_c_int64_t], out_shape, ndim)
    call expect(status == TREADLE_OK .and. ndim == 2 .and. all(out_shape(1:2) == [2, 4]), &
                'output_shape in Fortran order')
    status = treadle_model_num_parameters(model, n)
    call expect(status == TREADLE_OK .and. n >= 3 * 5 + 5 + 5 * 2 + 2, 'num_parameters')  ! + padding
    allocate (params(n), back(n), back32(n))
    params = [(-1 + 2 * real(i - 1, c_double) / real(n - 1, c_double), i = 1, int(n))]
    call expect(treadle_model_set_parameters(model, params) == TREADLE_OK, 'set_parameters')
    status = treadle_model_get_parameters(model, back)
    call expect(status == TREADLE_OK .and. all(back == params), 'get_parameters returns what was set')
    status = treadle_model_set_parameters(model, params(1:n - 1))
    call expect(status == TREADLE_ERROR_ARGUMENT .and. &
                index(treadle_error_message(), 'treadle_model_set_parameters: count is') == 1, &
                'set_parameters with a short buffer', treadle_error_message())
    status = treadle_model_get_parameters(model, back32)
    call expect(status == TREADLE_ERROR_TYPE .and. &
                index(treadle_error_message(), 'expected buffer of float64 values') > 0, &
                'get_parameters into real(c_float)', treadle_error_message())
    x = 0.5_c_double
    status = treadle_model_predict(never_created, x, y)
    call expect(status == TREADLE_ERROR_ARGUMENT .and. &
                treadle_error_message() == 'treadle_model_predict: model is NULL', 'null handle', &
                treadle_error_message())
    call treadle_model_free(model)
    call treadle_model_free(never_created)  ! a null handle is fine
  end subroutine check_basics

  ! Backend, precision and deterministic mode: each keeps predictions finite and the same shape;
  ! bad names and a bf16 float64 model are errors naming the problem.
  subroutine check_plan_settings()
    type(treadle_model) :: model, model64
    real(c_float) :: x(3, 4), y(2, 4), y_ref(2, 4)
    x = 0.25_c_float
    call expect(treadle_model_from_json(MLP, TREADLE_F32, 5, model) == TREADLE_OK, 'from_json for settings')
    call expect(treadle_model_predict(model, x, y_ref) == TREADLE_OK, 'predict before settings')
    call expect(treadle_model_set_deterministic(model, .true.) == TREADLE_OK, 'set_deterministic')
    call expect(treadle_model_set_fusion(model, .false.) == TREADLE_OK, 'set_fusion off')
    status = treadle_model_predict(model, x, y)
    call expect(status == TREADLE_OK .and. maxval(abs(y - y_ref)) <= 1e-6_c_float, 'unfused predicts the same values')
    call expect(treadle_model_set_fusion(model, .true.) == TREADLE_OK, 'set_fusion on')
    call expect(treadle_model_set_backend(model, 'eigen') == TREADLE_OK, 'set_backend eigen')
    status = treadle_model_predict(model, x, y)
    call expect(status == TREADLE_OK .and. all(y == y_ref), 'deterministic eigen predicts the same values')
    call expect(treadle_model_set_precision(model, 'bf16') == TREADLE_OK, 'set_precision bf16')
    status = treadle_model_predict(model, x, y)
    call expect(status == TREADLE_OK .and. maxval(abs(y - y_ref)) < 2e-2, 'bf16 predictions within 2e-2')
    status = treadle_model_set_backend(model, 'no-such-backend')
    call expect(status == TREADLE_ERROR_VALUE .and. index(treadle_error_message(), 'no-such-backend') > 0, &
                'unknown backend is named', treadle_error_message())
    status = treadle_model_set_precision(model, 'fp8')
    call expect(status == TREADLE_ERROR_VALUE .and. index(treadle_error_message(), 'fp8') > 0, &
                'unknown precision is named', treadle_error_message())
    call expect(treadle_model_from_json(MLP, TREADLE_F64, 5, model64) == TREADLE_OK, 'from_json float64 settings')
    status = treadle_model_set_precision(model64, 'bf16')
    call expect(status == TREADLE_ERROR_TYPE .and. index(treadle_error_message(), 'float32') > 0, &
                'bf16 on a float64 model is a type error', treadle_error_message())
    call treadle_model_free(model)
    call treadle_model_free(model64)
  end subroutine check_plan_settings

  ! The installation check from Fortran: one op, quick; an unknown op is a value error, named.
  subroutine check_verify()
    integer(c_int64_t) :: failed
    status = treadle_verify(failed, quick=.true., ops='linear')
    call expect(status == TREADLE_OK .and. failed == 0, 'verify linear passes')
    status = treadle_verify(failed, ops='no_such_op')
    call expect(status == TREADLE_ERROR_VALUE .and. index(treadle_error_message(), 'no_such_op') > 0, &
                'verify names an op without a case', treadle_error_message())
  end subroutine check_verify

  ! Online training: samples pushed from a time loop into a replay buffer, batches sampled for steps, a
  ! checkpoint with the buffer that resumes the same steps bit for bit; wrong arrays named.
  subroutine check_replay()
    type(treadle_model) :: model
    type(treadle_trainer) :: trainer
    type(treadle_replay) :: buffer
    real(c_float) :: x(3, 6), y(2, 6), bx(3, 4), by(2, 4), wrong(2, 4)
    real(c_float), allocatable :: first(:), again(:)
    integer(c_int64_t) :: n
    real(c_double) :: loss
    integer :: i, step
    call expect(treadle_replay_create(buffer, 'firo', 32, 3, 2, TREADLE_F32, min_size=4, max_reuse=0, seed=3) &
                == TREADLE_OK, 'replay_create')
    call expect(treadle_model_from_json(MLP, TREADLE_F32, 7, model) == TREADLE_OK, 'from_json for replay')
    call expect(treadle_trainer_create(model, 'mse', 'adam', '{"lr": 0.01}', 0, trainer) == TREADLE_OK, &
                'trainer for replay')
    call expect(.not. treadle_replay_ready(buffer, 4), 'an empty buffer is not ready')
    status = treadle_replay_sample(buffer, bx, by)
    call expect(status == TREADLE_ERROR_VALUE .and. index(treadle_error_message(), 'push more first') > 0, &
                'sampling below the watermark is refused', treadle_error_message())
    status = TREADLE_OK
    do step = 1, 6
      if (step == 4) status = treadle_trainer_save_checkpoint(trainer, 'replay_check.treadle', buffer)
      if (status /= TREADLE_OK) exit
      x = reshape([(real(i + step, c_float) / 10, i = 1, 18)], [3, 6])
      y = 2 * x(1:2, :)
      status = treadle_replay_push(buffer, x, y)
      if (status /= TREADLE_OK) exit
      status = treadle_replay_sample(buffer, bx, by)
      if (status /= TREADLE_OK) exit
      if (any(by /= 2 * bx(1:2, :))) status = -1
      status = max(status, treadle_trainer_step(trainer, bx, by, loss))
    end do
    call expect(status == TREADLE_OK, 'six steps push, sample (fields kept together) and train', treadle_error_message())
    call expect(treadle_replay_size(buffer) == 32_c_int64_t, 'the buffer holds its capacity')
    call expect(treadle_model_num_parameters(model, n) == TREADLE_OK, 'num_parameters for replay')
    allocate (first(n), again(n))
    status = treadle_model_get_parameters(model, first)
    call expect(treadle_trainer_load_checkpoint(trainer, 'replay_check.treadle', buffer) == TREADLE_OK, &
                'load_checkpoint with the buffer', treadle_error_message())
    do step = 4, 6
      x = reshape([(real(i + step, c_float) / 10, i = 1, 18)], [3, 6])
      y = 2 * x(1:2, :)
      status = max(treadle_replay_push(buffer, x, y), treadle_replay_sample(buffer, bx, by))
      status = max(status, treadle_trainer_step(trainer, bx, by, loss))
    end do
    status = max(status, treadle_model_get_parameters(model, again))
    call expect(status == TREADLE_OK .and. all(again == first), 'the resumed steps are bitwise the same')
    status = treadle_replay_push(buffer, x, wrong)
    call expect(status == TREADLE_ERROR_ARGUMENT .and. index(treadle_error_message(), 'y(2, 4)') > 0, &
                'arrays of another sample count are named', treadle_error_message())
    status = treadle_replay_push(buffer, real(x, c_double), real(y, c_double))
    call expect(status == TREADLE_ERROR_TYPE, 'arrays of another real kind are refused', treadle_error_message())
    call treadle_replay_free(buffer)
    call treadle_trainer_free(trainer)
    call treadle_model_free(model)
  end subroutine check_replay

  logical function c_associated_version()
    use, intrinsic :: iso_c_binding, only: c_associated
    c_associated_version = c_associated(c_treadle_version())
  end function c_associated_version

  ! forward, backward with dL/d(output) = 1, gradients, one SGD update: params - lr * grads.
  subroutine check_phases()
    type(treadle_model) :: model
    type(treadle_trainer) :: trainer
    real(c_double) :: x(3, 4), out(2, 4), ones(2, 4), empty(0)
    real(c_double), allocatable :: before(:), grads(:), after(:)
    integer(c_int64_t) :: n
    integer :: i
    call expect(treadle_model_from_json(MLP, TREADLE_F64, 5_c_int64_t, model) == TREADLE_OK, 'from_json int64 seed')
    call expect(treadle_model_num_parameters(model, n) == TREADLE_OK, 'num_parameters again')
    allocate (before(n), grads(n), after(n))
    call expect(treadle_model_get_parameters(model, before) == TREADLE_OK, 'initial parameters')
    call expect(treadle_trainer_create(model, 'mse', 'sgd', '{"lr": 0.1}', 0, trainer) == TREADLE_OK, &
                'trainer_create')
    x = reshape([(real(i, c_double) / 10, i = 0, 11)], [3, 4])
    ones = 1
    call expect(treadle_trainer_zero_grad(trainer) == TREADLE_OK, 'zero_grad')
    call expect(treadle_trainer_forward(trainer, x, out) == TREADLE_OK, 'forward')
    status = treadle_trainer_backward(trainer, real(ones, c_float))
    call expect(status == TREADLE_ERROR_TYPE .and. &
                index(treadle_error_message(), 'treadle_trainer_backward: expected grad_out of float64') == 1, &
                'backward with real(c_float)', treadle_error_message())
    call expect(treadle_trainer_backward(trainer, ones) == TREADLE_OK, 'backward')
    call expect(treadle_trainer_get_gradients(trainer, empty) == TREADLE_ERROR_ARGUMENT, &
                'get_gradients into an empty buffer')
    call expect(treadle_trainer_get_gradients(trainer, grads) == TREADLE_OK, 'get_gradients')
    ! The last Linear's bias gradient is the column sums of dL/d(output): 4 rows of ones, two 4.0s.
    call expect(count(grads == 4) >= 2 .and. count(grads /= 0) > 20, 'gradients')
    call expect(treadle_trainer_update(trainer) == TREADLE_OK, 'update')
    call expect(treadle_model_get_parameters(model, after) == TREADLE_OK, 'updated parameters')
    call expect(maxval(abs(after - (before - 0.1_c_double * grads))) <= 1e-15_c_double, 'one SGD step')
    call treadle_model_free(model)  ! the trainer keeps the model alive
    call expect(treadle_trainer_forward(trainer, x, out) == TREADLE_OK, 'forward after the model handle is freed')
    call treadle_trainer_free(trainer)
  end subroutine check_phases

  ! evaluate changes nothing; save + load_weights moves weights between models.
  subroutine check_evaluate_and_files()
    type(treadle_model) :: model, other
    type(treadle_trainer) :: trainer
    real(c_float) :: x(3, 8), y(2, 8), p1(2, 8), p2(2, 8)
    real(c_double) :: loss1, loss2
    integer :: i
    x = reshape([(sin(0.3 * i), i = 1, 24)], [3, 8])
    y = reshape([(cos(0.2 * i), i = 1, 16)], [2, 8])
    call expect(treadle_model_from_json(MLP, TREADLE_F32, 11, model) == TREADLE_OK, 'float32 model')
    call expect(treadle_trainer_create(model, 'huber', 'adam', '', 1, trainer) == TREADLE_OK, &
                'trainer with default options')
    call expect(treadle_trainer_evaluate(trainer, x, y, loss1) == TREADLE_OK, 'evaluate')
    status = treadle_trainer_evaluate(trainer, x, y, loss2)
    call expect(status == TREADLE_OK .and. loss1 == loss2 .and. loss1 > 0, 'evaluate is repeatable')
    call expect(treadle_trainer_step(trainer, x, y) == TREADLE_OK, 'step without a loss argument')
    status = treadle_trainer_evaluate(trainer, x, y, loss2)
    call expect(status == TREADLE_OK .and. loss2 < loss1, 'evaluate after a step')
    call expect(treadle_model_save(model, 'wrapper_check.safetensors   ') == TREADLE_OK, &
                'save (trailing blanks dropped)')
    call expect(treadle_model_from_json(MLP, TREADLE_F32, 12, other) == TREADLE_OK, 'another model')
    call expect(treadle_model_load_weights(other, 'wrapper_check.safetensors') == TREADLE_OK, 'load_weights')
    call expect(treadle_model_predict(model, x, p1) == TREADLE_OK, 'predict')
    status = treadle_model_predict(other, x, p2)
    call expect(status == TREADLE_OK .and. all(p1 == p2), 'loaded weights predict the same')
    status = treadle_model_load('no/such/file.safetensors', other)
    call expect(status == TREADLE_ERROR_IO .and. &
                index(treadle_error_message(), 'no/such/file.safetensors') > 0, 'load of a missing file', &
                treadle_error_message())
    status = treadle_trainer_create(model, 'mse', 'lbfgs', '', 0, trainer)
    call expect(status == TREADLE_ERROR_VALUE .and. &
                index(treadle_error_message(), "unknown optimizer 'lbfgs'") > 0, 'unknown optimizer', &
                treadle_error_message())
    call treadle_model_free(model)
    call treadle_model_free(other)
  end subroutine check_evaluate_and_files

  ! cross_entropy takes class indices: integer(c_int64_t) y(batch).
  subroutine check_class_indices()
    type(treadle_model) :: model
    type(treadle_trainer) :: trainer
    real(c_float) :: x(3, 6), wrong(2, 6)
    integer(c_int64_t) :: labels(6)
    real(c_double) :: first, last
    integer :: i, step
    x = reshape([(cos(0.7 * i), i = 1, 18)], [3, 6])
    labels = [0, 1, 1, 0, 1, 0]
    wrong = 0
    call expect(treadle_model_from_json(MLP, TREADLE_F32, 2, model) == TREADLE_OK, 'classifier')
    call expect(treadle_trainer_create(model, 'cross_entropy', 'adam', '{"lr": 0.05}', 0, trainer) == TREADLE_OK, &
                'cross_entropy trainer')
    status = TREADLE_OK
    do step = 1, 30
      if (status == TREADLE_OK) status = treadle_trainer_step(trainer, x, labels, last)
      if (step == 1) first = last
    end do
    call expect(status == TREADLE_OK, 'steps on class indices')
    call expect(last < 0.5 * first, 'cross_entropy loss falls')
    status = treadle_trainer_step(trainer, x, wrong)
    call expect(status == TREADLE_ERROR_TYPE .and. &
                index(treadle_error_message(), 'treadle_trainer_step: expected y of int64 class indices') == 1, &
                'real targets for cross_entropy', treadle_error_message())
    call treadle_trainer_free(trainer)
    call treadle_model_free(model)
  end subroutine check_class_indices

  ! Non-contiguous sections are copied in and out by the compiler: results as for contiguous copies.
  subroutine check_sections()
    type(treadle_model) :: model
    real(c_float) :: big(6, 10), x(3, 5), y(2, 5), y_big(4, 10)
    integer :: i
    big = reshape([(sin(0.05 * i), i = 1, 60)], [6, 10])
    x = big(1:6:2, 1:10:2)
    y_big = -1
    call expect(treadle_model_from_json(MLP, TREADLE_F32, 4, model) == TREADLE_OK, 'model for sections')
    call expect(treadle_model_predict(model, x, y) == TREADLE_OK, 'predict on a contiguous copy')
    status = treadle_model_predict(model, big(1:6:2, 1:10:2), y_big(2:3, 1:10:2))
    call expect(status == TREADLE_OK, 'predict on sections')
    call expect(all(y_big(2:3, 1:10:2) == y) .and. all(y_big(1, :) == -1) .and. all(y_big(2:3, 2:10:2) == -1), &
                'sections hold the same results and nothing else changed')
    call treadle_model_free(model)
  end subroutine check_sections

end program wrapper_check
