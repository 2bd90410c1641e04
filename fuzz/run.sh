#!/bin/sh
# Runs one fuzz target with the limits every run uses (docs/testing.md §9): a single allocation
# above 256 MiB, a process above 512 MiB or an input slower than 5 s is a finding. New inputs go
# to a scratch corpus, so the committed seeds in corpus/TARGET stay small.
#   fuzz/run.sh TARGET [RUNS]     (default 10 000 000 inputs, one job)
set -eu
target=${1:?usage: fuzz/run.sh TARGET [RUNS]}
runs=${2:-10000000}
cd "$(dirname "$0")"
scratch=${FUZZ_SCRATCH:-/tmp/koala-fuzz-corpus}/$target
mkdir -p "$scratch"
exec nice -n 15 cargo +nightly fuzz run -O "$target" "$scratch" "corpus/$target" -- \
  -runs="$runs" -jobs=1 -workers=1 -rss_limit_mb=512 -malloc_limit_mb=256 -timeout=5 -print_final_stats=1
