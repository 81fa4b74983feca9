#!/bin/sh
# modes_once.py in fresh processes under OpenMP wait settings, alternated: omp_env.sh ROUNDS
# (libgomp reads GOMP_SPINCOUNT / OMP_WAIT_POLICY once, at load: one process per setting)
cd "$(dirname "$0")/../../.."
for i in $(seq 1 "${1:-2}"); do
  RAY_AUTH_MODE=disabled .venv/bin/python research/results/2026-12-07-eleventh/modes_once.py 3 default 2>/dev/null | grep default
  GOMP_SPINCOUNT=20000000 RAY_AUTH_MODE=disabled .venv/bin/python research/results/2026-12-07-eleventh/modes_once.py 3 spin2e7 2>/dev/null | grep spin2e7
  OMP_WAIT_POLICY=active RAY_AUTH_MODE=disabled .venv/bin/python research/results/2026-12-07-eleventh/modes_once.py 3 active 2>/dev/null | grep active
done
