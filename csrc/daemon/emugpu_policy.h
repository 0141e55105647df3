/* A sharing policy for emugpud as a shared library (emugpud --sharing
 * plugin:PATH.so): C, so that it builds with any compiler and no torch-emugpu
 * headers but this one. emugpud calls emugpu_share_policy at every share
 * report of a process (every 2 ms of real time while it launches work), from
 * its one thread: keep it fast and free of blocking calls.
 *
 * It returns the fraction of the GPU's speed `me`'s kernels get while it has
 * work; emugpud clamps it to [0.01, 1] (a non-finite value counts as 1). */
#ifndef EMUGPU_POLICY_H
#define EMUGPU_POLICY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a process reported about its compute on one GPU (docs/gpu-sharing.md). */
typedef struct emugpu_sharer {
  double busy;          /* fraction of the recent window its compute engine had work, [0, 1] */
  int64_t iteration_ns; /* its compute between host waits, alone on the GPU */
  int32_t priority;     /* EMUGPU_PRIORITY */
  double demand;        /* fraction of the GPU's SMs its kernels hold while they run */
  int64_t hold_ns;      /* how long its kernels' blocks hold an SM */
} emugpu_sharer;

/* `others`: the `count` other processes with work on the same GPU recently. */
double emugpu_share_policy(const emugpu_sharer* me, const emugpu_sharer* others, size_t count);

#ifdef __cplusplus
}
#endif

#endif
