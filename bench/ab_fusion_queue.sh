#!/usr/bin/env bash
# The trainer's device operations resolved on the training thread (ASRT_FUSION_QUEUE=0) against
# queued in fusion's stream (ASRT_FUSION_QUEUE=1, the default): bench/ab_env.sh's A/B of that
# switch. bench/RESULTS.md, 2026-11-29 (21:24 session).
#
#   bash bench/ab_fusion_queue.sh [ASRT] [DEVICE]     ASRT defaults to the release build
exec bash "$(dirname "$0")/ab_env.sh" ASRT_FUSION_QUEUE "$@"
