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
IDEM_CMAKE_BUILD_DIR=$build "$work/venv/bin/pip" install --no-build-isolation --no-deps -q "$src"
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
