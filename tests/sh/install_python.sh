#!/usr/bin/env bash
# install_python.sh - deploy/install-python.sh on a machine where it has
# run (the suite's own set-up ran it): a second run installs nothing, says
# so for both parts, and leaves the environment and the compiler as they
# were; what it left there is what the lock names.
source "$(dirname "$0")/lib.bash"
prefix=$(bash "$SRC/deploy/deps-prefix.sh")
if [ ! -f "$prefix/venv/.stamp" ] || [ ! -f "$prefix/cuda-wheels/.stamp" ]; then
  echo "skipped: deploy/install-python.sh has not run here ($prefix)"; exit 77
fi
before=$(stat -c '%Y %i' "$prefix/venv/.stamp" "$prefix/cuda-wheels/.stamp" "$prefix/venv/bin/python")
bash "$SRC/deploy/install-python.sh" >"$T/out" 2>&1
check "a second run exits 0" test $? -eq 0
check "the environment is present, not installed again" grep -q "environment present" "$T/out"
check "the CUDA compiler is present, not installed again" grep -q "CUDA compiler present" "$T/out"
check "nothing is said to be installed" bash -c "! grep -q ' into ' '$T/out'"
check "the stamps and the interpreter are untouched" \
  test "$before" = "$(stat -c '%Y %i' "$prefix/venv/.stamp" "$prefix/cuda-wheels/.stamp" "$prefix/venv/bin/python")"
"$prefix/venv/bin/pip" freeze --disable-pip-version-check 2>/dev/null | sort -f >"$T/freeze"
grep -vE '^\s*(#|$)' "$SRC/deploy/python/requirements.lock" | grep -v '# cuda$' | sed 's/ *#.*//' |
  sort -f >"$T/lock"
check "the environment holds exactly the lock's packages and versions" \
  diff <(sed 's/_/-/g' "$T/lock" | tr A-Z a-z) <(sed 's/_/-/g' "$T/freeze" | tr A-Z a-z)
check "nvcc runs" bash -c "'$prefix/cuda/bin/nvcc' --version >/dev/null"
finish
