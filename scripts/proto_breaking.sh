#!/usr/bin/env bash
# No change to proto/ may break a client: buf's FILE rules (wire and generated code) against the
# declared v1 baseline (proto/baseline/v1.binpb, made by `make proto-baseline` when a version is
# declared), and against the previous commit's protos, so each commit is judged on its own.
# First argument: the buf binary.
set -euo pipefail
buf="${1:?usage: proto_breaking.sh BUF}"
cd "$(dirname "$0")/.."

"$buf" breaking --against proto/baseline/v1.binpb
echo "proto/: no breaking change against the v1 baseline"

# Uncommitted changes to proto/ (or buf.yaml) are judged against HEAD, what they change; a clean
# tree against HEAD~1, what the last commit changed.
if ! git diff --quiet HEAD -- proto buf.yaml 2>/dev/null || [ -n "$(git ls-files --others --exclude-standard proto)" ]; then
    "$buf" breaking --against '.git#ref=HEAD'
    echo "proto/: no breaking change against the last commit (the working tree's changes)"
elif ! git rev-parse --verify -q HEAD~1 >/dev/null; then
    echo "proto/: no previous commit in this clone (a shallow clone?): compared with the v1 baseline only"
elif ! git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then
    echo "proto/: the previous commit predates buf.yaml: compared with the v1 baseline only"
else
    "$buf" breaking --against '.git#ref=HEAD~1'
    echo "proto/: no breaking change against the previous commit"
fi
