#!/usr/bin/env bash
# The long soak (see tests/it/soak/mod.rs): tests/soak/run.sh [--cycles N] [--seed S] [--from K] [--debug]
# Defaults: 200 cycles, a random seed (printed). Replay one cycle K of a run with
# --seed S --from K --cycles 1. Set REPLICAD_TEST_KEEP=1 to keep every cycle's directory
# (a failing cycle's directory is always kept and its path printed). --debug uses the dev
# profile (no release build to wait for; each cycle is slower).
set -euo pipefail
cd "$(dirname "$0")/../.."
cycles=200 seed="" from=0 profile=--release
while [ $# -gt 0 ]; do
  case "$1" in
    --cycles) cycles="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --from) from="$2"; shift 2 ;;
    --debug) profile=""; shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$seed" ]; then seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' '); fi
echo "soak: --cycles $cycles --seed $seed --from $from"
SOAK_CYCLES="$cycles" SOAK_SEED="$seed" SOAK_FROM="$from" \
  exec cargo test $profile --test it -- --ignored --exact soak::soak_long --nocapture
