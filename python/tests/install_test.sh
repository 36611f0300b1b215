#!/usr/bin/env bash
# The documented install (docs/python.md, "Installing"): a venv that sees Debian's packages,
# then `pip install --no-build-isolation ./python`; the package must then import from the
# venv (not from the build tree) and work, from a directory outside the repository.
# Reuses the caller's build tree (IDEM_CMAKE_BUILD_DIR) so that CI does not build twice.
#   install_test.sh PYTHON SOURCE_DIR(python/) BUILD_DIR
set -euo pipefail
python=$1 src=$2 build=$3
work=$(mktemp -d /tmp/idem-python-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$python" -m venv --system-site-packages "$work/venv"
# (setuptools leaves python/build/ and python/idem.egg-info/ behind; .gitignore has them.)
# -v as documented: pip then passes the build's progress lines on (setup.py's "idem:" lines
# and CMake's), which it otherwise keeps to itself.
if ! IDEM_CMAKE_BUILD_DIR=$build "$work/venv/bin/pip" install -v --no-build-isolation --no-deps \
    "$src" >"$work/pip.log" 2>&1; then
  cat "$work/pip.log"
  exit 1
fi
for line in "idem: using the CMake build tree $build" "idem: compiling the C++ library" "idem: built _idem"; do
  if ! grep -qF "$line" "$work/pip.log"; then
    cat "$work/pip.log"
    echo "install_test.sh: pip install -v did not show the build's progress line: $line" >&2
    exit 1
  fi
done
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys
import idem
venv = sys.argv[1]
assert idem.__file__.startswith(venv), idem.__file__
assert idem._idem.__file__.startswith(venv), idem._idem.__file__
ex = idem.Executor(f"sqlite://{venv}/check.db")
first = ex.run("install", "k", lambda a: {"token": a.token})
again = ex.run("install", "k", lambda a: None)
assert not first.replayed and again.replayed and again.value == first.value
print("installed", idem.__version__, "at", idem.__file__, "stores:", idem.available_schemes())
PY
"$work/venv/bin/pip" show idem | grep -E "^(Name|Version|Location):"
