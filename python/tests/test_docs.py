"""docs/python.md's install instructions say what the build needs and how to see it move
(issue 36): the documented pip line shows the build's progress, the apt line has what
setup.py uses, the middleware's section names the packages its example needs, and
scripts/deps.sh (what CI and scripts/run.sh install) has everything the docs list."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "python.md"
SETUP = ROOT / "python" / "setup.py"
DEPS = ROOT / "scripts" / "deps.sh"


def section(title: str) -> str:
    text = DOCS.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def apt_packages(text: str) -> list:
    """The packages of every `# apt-get install ...` line (with its continuations)."""
    packages = []
    for m in re.finditer(r"^# apt-get install ((?:.*\\\n)*.*)$", text, re.MULTILINE):
        packages += m.group(1).replace("\\\n", " ").split()
    return packages


def deps_sh_packages() -> set:
    """Every package of scripts/deps.sh's arrays (IDEM_PACKAGES and those it expands)."""
    words = set()
    for body in re.findall(r"^\w+=\(\n(.*?)^\)$", DEPS.read_text(), re.MULTILINE | re.DOTALL):
        for line in body.splitlines():
            words.update(w for w in line.split("#", 1)[0].split() if not w.startswith('"$'))
    return words


def test_the_documented_install_shows_the_builds_progress():
    install = section("Installing")
    lines = [line for line in install.splitlines() if re.search(r"\bpip install\b.*\./python", line)]
    assert lines, "no pip install ./python line in Installing"
    # pip hides a build backend's output (only "still running" for minutes) unless -v.
    assert all(re.search(r"\bpip install (-v|--verbose)\b", line) for line in lines), lines


def test_setup_py_prints_its_progress_in_order(tmp_path):
    # setup.py with a stand-in for cmake (the real build is tests/install_test.sh's): its own
    # "idem:" lines come before and after the build's, through a pipe as pip reads them
    # (unflushed, they would all come at the end, after minutes of silence).
    fake = tmp_path / "bin" / "cmake"
    fake.parent.mkdir()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    fake.write_text(
        f"""#!{sys.executable}
import sys, pathlib
args = sys.argv[1:]
if args[0] == "--build":
    build = pathlib.Path(args[1])
    for i in (1, 2):
        print(f"[{{i}}/2] Building CXX object step{{i}}.o", flush=True)
    module = build / "python" / "idem" / "_idem{suffix}"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_bytes(b"")
    (build / "python" / "extension-path.txt").write_text(str(module) + "\\n")
else:
    build = pathlib.Path(args[args.index("-B") + 1])
    build.mkdir(parents=True, exist_ok=True)
    (build / "CMakeCache.txt").write_text("CMAKE_CXX_COMPILER_LAUNCHER:UNINITIALIZED=ccache\\n")
    print("-- Configuring done", flush=True)
"""
    )
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("IDEM_CMAKE_BUILD_DIR", None)
    out = subprocess.run(
        [sys.executable, str(SETUP), "-q", "build_ext", "--build-temp", str(tmp_path / "t"),
         "--build-lib", str(tmp_path / "lib")],
        cwd=SETUP.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=120,
    ).stdout
    lines = [line for line in out.splitlines() if line.startswith(("idem:", "[", "--"))]
    assert [line.split(" ", 2)[:2] for line in lines] == [
        ["idem:", "configuring"],
        ["--", "Configuring"],
        ["idem:", "compiling"],
        ["[1/2]", "Building"],
        ["[2/2]", "Building"],
        ["idem:", "built"],
    ], out
    assert "through ccache" in out, out
    assert (tmp_path / "lib" / "idem" / f"_idem{suffix}").exists()


def test_the_apt_line_has_ccache_since_the_build_uses_it():
    assert "ccache" in SETUP.read_text()
    assert "ccache" in apt_packages(section("Installing"))


def test_the_middleware_section_names_what_its_example_needs():
    asgi = section("The ASGI middleware")
    before_example = asgi[: asgi.index("```python")]
    packages = apt_packages(before_example)
    assert "python3-starlette" in packages and "python3-uvicorn" in packages


def test_deps_sh_installs_what_the_docs_list():
    missing = sorted(set(apt_packages(DOCS.read_text())) - deps_sh_packages())
    assert not missing, f"in docs/python.md's apt lines but not in scripts/deps.sh: {missing}"
