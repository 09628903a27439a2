#include "backends/onednn/onednn_common.hpp"

namespace treadle::onednn {

std::vector<OpEntry> rnn_entries() { return {}; }

}  // namespace treadle::onednn
