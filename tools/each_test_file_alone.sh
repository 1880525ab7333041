#!/usr/bin/env bash
# Runs every tests/test_*.py on its own (plain `pytest FILE -x -q`, the repository root off sys.path), one after the
# other, and prints one line per file: ok / FAILED / all-slow (exit 5: every test is marked slow).
# Every test file must pass alone (a file that leans on another's imports or sys.path fails here).
#   tools/each_test_file_alone.sh [per-file timeout in seconds, default 1200]
cd "$(dirname "$0")/.." || exit 2
limit=${1:-1200}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The package importable as if installed, the repository root not on sys.path (as under plain
# `pytest` in a checkout with `pip install .`): a folder holding only a link to vitpose/.
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
ln -s "$PWD/vitpose" "$site/vitpose"
export PYTHONPATH=$site
status=0
for file in tests/test_*.py; do
    start=$(date +%s)
    timeout "$limit" pytest -x -q -p no:cacheprovider "$file" > "/tmp/alone.$(basename "$file").log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    case $rc in
        0) verdict=ok ;;
        5) verdict=all-slow ;;
        124) verdict="TIMEOUT after ${limit}s"; status=1 ;;
        *) verdict="FAILED (rc $rc, see /tmp/alone.$(basename "$file").log)"; status=1 ;;
    esac
    echo "$file ${took}s $verdict"
done
exit $status
