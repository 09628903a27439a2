#pragma once
// Shared by the recurrent op definitions (ops/recurrent.cpp) and their kernels: which input sits
// where, how wide each saved buffer is, and how the scratch space is carved. One layer op runs one
// layer in one direction over a whole sequence:
//
//   rnn_layer / gru_layer:  (x, h0,     w_ih, w_hh, [b_ih, b_hh], [lengths]) -> (y, h_n,      [saved])
//   lstm_layer:             (x, h0, c0, w_ih, w_hh, [b_ih, b_hh], [lengths]) -> (y, h_n, c_n, saved)
//   *_layer_backward:       (x, h0, [c0], w_ih, w_hh, [b_ih, b_hh], y, h_n, [c_n], [saved],
//                            dy, dh_n, [dc_n], [lengths])
//                           -> (dx, dh0, [dc0], dw_ih, dw_hh, [db_ih, db_hh])
//
// The backward op is the layer's whole gradient: the time loop and the weight, bias and input
// gradients, so that a backend with its own recurrent training primitive (oneDNN) can take the
// pair forward + backward as one unit. It reads the forward's inputs and outputs (a backend may
// need any of them) and writes dx only when the attribute `needs_dx` is 1 (x is often data).
//
// x and y are (T, N, F) or, with batch_first, (N, T, F); h0/h_n/c0/c_n are (N, H); lengths is int64
// (N). Optional inputs are told apart by count (bias adds two, lengths one, always last).
// `saved` holds what backward needs per step, in x's layout: LSTM (i, f, g, o, c, tanh c) = 6H, GRU
// (r, z, n, W_hn h + b_hn) = 4H; the plain RNN needs only y.
#include <cstddef>
#include <cstdint>
#include <string>

namespace treadle::rnn {

enum class Cell : uint8_t { rnn, gru, lstm };

struct CellInfo {
  Cell cell;
  int gates;        // G: rows of w_ih are G * H
  int saved_width;  // S: saved buffer is S * H wide (0: no saved output)
  bool has_cell_state;
};

inline CellInfo cell_info(Cell c) {
  switch (c) {
    case Cell::rnn: return {c, 1, 0, false};
    case Cell::gru: return {c, 3, 4, false};
    case Cell::lstm: return {c, 4, 6, true};
  }
  return {c, 1, 0, false};
}

inline const char* layer_op_name(Cell c) {
  return c == Cell::rnn ? "rnn_layer" : c == Cell::gru ? "gru_layer" : "lstm_layer";
}

// Input positions of a forward layer op with `num_inputs` inputs (-1: absent).
struct ForwardSlots {
  int x = 0, h0 = 1, c0 = -1, w_ih, w_hh, b_ih = -1, b_hh = -1, lengths = -1;
  bool valid = true;
};

inline ForwardSlots forward_slots(const CellInfo& ci, int num_inputs) {
  ForwardSlots s;
  int k = 2;
  if (ci.has_cell_state) s.c0 = k++;
  s.w_ih = k++;
  s.w_hh = k++;
  const int extra = num_inputs - k;
  if (extra < 0 || extra > 3) {
    s.valid = false;
    return s;
  }
  if (extra >= 2) {
    s.b_ih = k++;
    s.b_hh = k++;
  }
  if (extra == 1 || extra == 3) s.lengths = k++;
  return s;
}

// Input positions of a backward layer op with `num_inputs` inputs (-1: absent), and its outputs.
struct BackwardSlots {
  int x = 0, h0 = 1, c0 = -1, w_ih, w_hh, b_ih = -1, b_hh = -1, y, h_n, c_n = -1, saved = -1, dy, dh_n, dc_n = -1,
      lengths = -1;
  bool valid = true;
  // Outputs.
  int dx = 0, dh0 = 1, dc0 = -1, dw_ih, dw_hh, db_ih = -1, db_hh = -1, num_outputs;
};

inline BackwardSlots backward_slots(const CellInfo& ci, int num_inputs) {
  BackwardSlots s;
  const int fixed = (ci.has_cell_state ? 12 : 8) + (ci.saved_width > 0 && !ci.has_cell_state ? 1 : 0);
  const int extra = num_inputs - fixed;
  s.valid = extra >= 0 && extra <= 3;
  int k = 2;
  if (ci.has_cell_state) s.c0 = k++;
  s.w_ih = k++;
  s.w_hh = k++;
  if (extra >= 2) {
    s.b_ih = k++;
    s.b_hh = k++;
  }
  s.y = k++;
  s.h_n = k++;
  if (ci.has_cell_state) s.c_n = k++;
  if (ci.saved_width > 0) s.saved = k++;
  s.dy = k++;
  s.dh_n = k++;
  if (ci.has_cell_state) s.dc_n = k++;
  if (extra == 1 || extra == 3) s.lengths = k++;
  s.valid = s.valid && k == num_inputs;
  int o = 2;
  if (ci.has_cell_state) s.dc0 = o++;
  s.dw_ih = o++;
  s.dw_hh = o++;
  if (s.b_ih >= 0) {
    s.db_ih = o++;
    s.db_hh = o++;
  }
  s.num_outputs = o;
  return s;
}

// Scratch layouts, in elements of the compute type after a leading int64 permutation of N rows.
// Both end with room for W_hh packed for the per-step products (backends/eigen/small_gemm.hpp):
// G*H*H elements, up to 64 columns of panel padding on the wider side and 64 bytes to align it.
inline std::size_t packed_hidden_weight_bytes(const CellInfo& ci, int64_t H, std::size_t esize) {
  const int64_t GH = ci.gates * H;
  return static_cast<std::size_t>(GH * H + 64 * GH) * esize + 64;
}

// Forward: state h (N*H), state c (N*H), per-step gate block (N*G*H).
inline std::size_t forward_workspace_bytes(const CellInfo& ci, int64_t N, int64_t H, std::size_t esize) {
  const int64_t elems = 2 * N * H + N * ci.gates * H;
  return static_cast<std::size_t>(N) * sizeof(int64_t) + static_cast<std::size_t>(elems) * esize +
         packed_hidden_weight_bytes(ci, H, esize);
}

// Backward: dh (N*H), dc (N*H), per-step hidden-side gate gradients (N*G*H), then over the whole
// sequence of T*N rows the input-side gate gradients (G*H wide), for GRU the hidden side's too, and
// each step's previous hidden state (H wide), from which the weight and input gradients follow.
inline std::size_t backward_workspace_bytes(const CellInfo& ci, int64_t T, int64_t N, int64_t H, std::size_t esize) {
  const int64_t GH = ci.gates * H;
  const int64_t elems = 2 * N * H + N * GH + T * N * (GH * (ci.cell == Cell::gru ? 2 : 1) + H);
  return static_cast<std::size_t>(N) * sizeof(int64_t) + static_cast<std::size_t>(elems) * esize +
         packed_hidden_weight_bytes(ci, H, esize);
}

}  // namespace treadle::rnn
