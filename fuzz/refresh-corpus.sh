#!/usr/bin/env bash
# Adds to each target's committed corpus at most N inputs (default 20) from its fuzzing output
# (fuzz/work/<target>, written by run.sh) that reach coverage the committed corpus does not,
# picked greedily: each pick is the input with the most coverage features not yet covered by the
# committed corpus and the earlier picks. Usage: fuzz/refresh-corpus.sh [N] [TARGET...]
#
# Why not commit libFuzzer's whole minimised set: after a long run it is hundreds to thousands of
# files per target, most adding a feature or two, and `cargo test` replays everything committed.
# A few tens of inputs that each open new code keep the replay under a second.
set -euo pipefail
cd "$(dirname "$0")"
limit="${1:-20}"
shift || true
source ./setup.sh "$@"

for target in "${targets[@]}"; do
  [ -d "work/$target" ] || { echo "$target: no fuzz/work/$target (run fuzz/run.sh first)"; continue; }
  tmp="work/refresh-$target"
  rm -rf "$tmp"
  mkdir -p "$tmp/initial"
  cp corpus/"$target"/* "$tmp/initial/"
  # A merge with the committed corpus as the initial set: the control file lists every input and,
  # for each one run, its features (`FT index feature...`); the initial set's come first.
  cargo fuzz run -s "$sanitizer" "$target" "$tmp/initial" "work/$target" -- \
    -merge=1 -merge_control_file="$tmp/control" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
    >"$tmp/merge.log" 2>&1 || { echo "$target: merge failed, see fuzz/$tmp/merge.log"; exit 1; }
  picks=$(awk -v limit="$limit" '
    NR == 1 { files = $1; next }
    NR == 2 { initial = $1; next }
    NR <= files + 2 { path[NR - 3] = $0; next }
    $1 == "FT" {
      i = $2
      if (i < initial) { for (k = 3; k <= NF; k++) covered[$k] = 1; next }
      feats[i] = ""
      for (k = 3; k <= NF; k++) feats[i] = feats[i] " " $k
    }
    END {
      for (n = 0; n < limit; n++) {
        best = -1; best_new = 0
        for (i in feats) {
          m = split(feats[i], f, " "); new = 0
          for (k = 1; k <= m; k++) if (!(f[k] in covered)) new++
          # Nothing new now means nothing new later: drop it. Ties go to the lower index (the
          # order of the control file), so the picks do not depend on awk'"'"'s hash order.
          if (new == 0) delete feats[i]
          else if (new > best_new || (new == best_new && i + 0 < best + 0)) { best = i; best_new = new }
        }
        if (best < 0) break
        m = split(feats[best], f, " ")
        for (k = 1; k <= m; k++) covered[f[k]] = 1
        print best_new "\t" path[best]
        delete feats[best]
      }
    }' "$tmp/control")
  added=0
  while IFS=$'\t' read -r new path; do
    [ -n "${path:-}" ] || continue
    [ "$(stat -c %s "$path")" -le 4096 ] || continue
    name=$(sha1sum "$path" | cut -d' ' -f1)
    [ -e "corpus/$target/$name" ] && continue
    cp "$path" "corpus/$target/$name"
    added=$((added + 1))
    echo "$target: + $name ($new new features)"
  done <<<"$picks"
  echo "$target: $added added, $(ls "corpus/$target" | wc -l) in the corpus"
  rm -rf "$tmp"
done
