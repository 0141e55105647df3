/* A sharing policy plugin for custom_policy_test.cpp: strict priorities,
 * equal shares among equals. */
#include "emugpu_policy.h"

double emugpu_share_policy(const emugpu_sharer* me, const emugpu_sharer* others, size_t count) {
  double equal = 1;
  for (size_t i = 0; i < count; ++i) {
    if (others[i].busy <= 0) continue;
    if (others[i].priority > me->priority) return 0; /* clamped to the daemon's minimum share */
    if (others[i].priority == me->priority) equal += 1;
  }
  return 1 / equal;
}
