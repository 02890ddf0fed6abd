#!/usr/bin/env bash
# Mutation testing (cargo-mutants) of the verdict and timing code against the fast suite:
# src/core/quorum.rs, src/core/budget.rs, src/core/round.rs, src/fencing.rs, and the lease
# renewal arithmetic of src/shared/lease.rs (LeaseState::is_lost, renew_at,
# renewal). Not run by CI: the unit-test stage of a full run takes about half an hour on
# two busy cores (some 335 mutants, a few seconds each), each survivor about a minute more
# in the sim stage.
#
# In stages, each on the survivors of the one before (a mutant caught is never re-run):
#   1. lib    `cargo test --lib`                      (seconds per mutant, after a ~20 s build)
#   2. sim    `cargo test --test sim`                  (about a minute per mutant, debug)
#   3. model  `cargo test --profile model --test model` (CI's model-checker set, ~60 s plus
#             an optimised build per mutant)
# then prints caught / missed / unviable / timeout per file, and the mutants missed by
# every stage (each must be killed by a test or listed in scripts/mutants-allowed.md).
#
# cargo-mutants copies the tree to a temp dir and mutates the copy (never --in-place), one
# job at a time, at nice 10. Dependencies are built once in target/mutants and kept across
# runs (CARGO_TARGET_DIR); the crate itself is built without debuginfo (faster builds).
# That target dir is the run's alone (a lock file says so): no other cargo command may use
# it meanwhile, since the crate's test binary has the same name from any copy of the tree.
#
#   MUTANTS_STAGES="lib sim model"  the stages to run, in this order (default: all three)
#   MUTANTS_SHARD=k/n               only mutants i with i % n == k (a documented sample)
#   MUTANTS_FILES="quorum budget round fencing lease"   which of the files (default: all)
#   MUTANTS_OUT=dir                 where the outcomes go (default target/mutants-out)
#   MUTANTS_LIST=1                  list the mutants of the selection and stop
#   MUTANTS_SUMMARY=1               only print the summary of the outcomes in MUTANTS_OUT
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-mutants >/dev/null 2>&1; then
  cargo install --locked cargo-mutants
fi

out=${MUTANTS_OUT:-$PWD/target/mutants-out}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/mutants}
stages=${MUTANTS_STAGES:-lib sim model}
files=${MUTANTS_FILES:-quorum budget round fencing lease}

# The selection: whole files, and in lease.rs only the renewal arithmetic.
re_parts=()
file_args=()
for f in $files; do
  case $f in
    quorum | budget | round)
      file_args+=(-f "src/core/$f.rs")
      re_parts+=("^src/core/$f\\.rs:")
      ;;
    fencing)
      file_args+=(-f src/fencing.rs)
      re_parts+=('^src/fencing\.rs:')
      ;;
    lease)
      file_args+=(-f src/shared/lease.rs)
      re_parts+=('^src/shared/lease\.rs:.*(LeaseState::is_lost|renew_at|renewal)')
      ;;
    *)
      echo "MUTANTS_FILES: unknown file '$f' (quorum budget round fencing lease)" >&2
      exit 2
      ;;
  esac
done
selection=$(IFS='|'; echo "${re_parts[*]}")

common=(--jobs 1 --no-shuffle -C --config=profile.dev.package.quorumlock.debug=0 "${file_args[@]}")
# The shard picks the sample in the first stage; later stages take its survivors by name.
shard=()
if [ -n "${MUTANTS_SHARD:-}" ]; then
  shard=(--shard "$MUTANTS_SHARD" --sharding round-robin)
fi

if [ -n "${MUTANTS_LIST:-}" ]; then
  cargo mutants --list "${common[@]}" "${shard[@]}" --re "$selection"
  exit 0
fi

# The names in a missed.txt as one regex (every name anchored, its metacharacters escaped).
names_re() {
  sed -e 's/[][\\.+*?(){}|^$#&~-]/\\&/g' -e 's/^/^/' -e 's/$/$/' "$1" | paste -sd'|'
}

if [ -z "${MUTANTS_SUMMARY:-}" ]; then
# One run at a time per target dir: cargo names the crate's test binary the same whatever
# tree it was built from, so a second run (or any cargo command with this target dir)
# could overwrite a mutant's binary between its build and its test.
mkdir -p "$CARGO_TARGET_DIR"
exec 9>"$CARGO_TARGET_DIR/.mutants.lock"
if ! flock -n 9; then
  echo "another run uses $CARGO_TARGET_DIR: wait for it, or set CARGO_TARGET_DIR" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
re=$selection
for stage in $stages; do
  case $stage in
    # The test target goes in as a cargo argument (-C), not after `--`: cargo-mutants
    # builds with `cargo test --no-run` before it tests, and without it that build would
    # compile every test target of the crate for each mutant.
    lib) args=(-C --lib --timeout 120 --build-timeout 600) ;;
    sim) args=(-C --test=sim --timeout 600 --build-timeout 900) ;;
    model) args=(--profile model -C --test=model --timeout 600 --build-timeout 1200) ;;
    *)
      echo "MUTANTS_STAGES: unknown stage '$stage' (lib sim model)" >&2
      exit 2
      ;;
  esac
  echo "==> stage $stage: $(date -u +%H:%M:%S)"
  # Exit 2 (mutants missed) and 3 (timeouts) are results; anything else (a failing
  # baseline, a usage error) stops the run.
  rc=0
  nice -n 10 cargo mutants "${common[@]}" "${shard[@]}" --re "$re" -o "$out/$stage" "${args[@]}" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ] && [ "$rc" -ne 3 ]; then
    echo "cargo mutants failed (exit $rc) in stage $stage: $out/$stage/mutants.out/debug.log" >&2
    exit "$rc"
  fi
  shard=()
  missed="$out/$stage/mutants.out/missed.txt"
  if [ ! -s "$missed" ]; then
    break
  fi
  re=$(names_re "$missed")
done
fi

python3 - "$out" $stages <<'EOF'
import json, os, sys
from collections import defaultdict

out, stages = sys.argv[1], sys.argv[2:]
final = {}  # mutant name -> (file, outcome, stage): the first stage that caught it, else the last that ran it
for stage in stages:
    path = os.path.join(out, stage, "mutants.out", "outcomes.json")
    if not os.path.exists(path):
        continue
    for o in json.load(open(path))["outcomes"]:
        s = o["scenario"]
        if s == "Baseline":
            continue
        m = s["Mutant"]
        kind = {
            "CaughtMutant": "caught",
            "MissedMutant": "missed",
            "Unviable": "unviable",
            "Timeout": "timeout",
        }.get(o["summary"], o["summary"])
        # Caught in any stage is caught: a later stage can only see what an earlier one
        # let through (cargo-mutants' --re lets some `delete field` mutants through again).
        if final.get(m["name"], (None, None))[1] != "caught":
            final[m["name"]] = (m["file"], kind, stage)

per = defaultdict(lambda: defaultdict(int))
by_stage = defaultdict(int)
for file, kind, stage in final.values():
    per[file][kind] += 1
    per["all"][kind] += 1
    if kind == "caught":
        by_stage[stage] += 1
print()
print(f"{'file':<24}{'caught':>8}{'missed':>8}{'unviable':>10}{'timeout':>9}  caught/viable")
for file in sorted(per, key=lambda f: (f == "all", f)):
    c = per[file]
    viable = c["caught"] + c["missed"] + c["timeout"]
    pct = f"{100 * c['caught'] / viable:.1f} %" if viable else "-"
    print(f"{file:<24}{c['caught']:>8}{c['missed']:>8}{c['unviable']:>10}{c['timeout']:>9}  {pct}")
print("caught by stage: " + ", ".join(f"{s} {by_stage[s]}" for s in stages))
print("(viable = caught + missed + timeout; a timeout is a test run that hung)")
missed = sorted(n for n, (_, k, _) in final.items() if k in ("missed", "timeout"))
if missed:
    print("\nmissed or timed out by every stage run:")
    for n in missed:
        print("  " + n)
EOF
