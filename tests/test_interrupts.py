"""Ctrl-C and SIGTERM end every script with one line and status 130: while it imports, and
while it works (scripts/_interrupts.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SCRIPTS = {
    "export_model": ["whisper", "--variant", "tiny"],
    "run_pte": ["missing.pte"],
    "coverage_audit": ["whisper", "--variant", "tiny"],
    "accuracy_report": ["whisper", "--variant", "tiny"],
    # Many small batches: on lavapipe a batch of model-shape launches, once queued, runs to
    # its end (up to a minute) before the process can exit.
    "bench_layer_norm": ["--shapes", ",".join(["512x512"] * 40), "--repeats", "200"],
    "plot_bench": ["results.json", "plot.png"],
    "tune_layouts": ["--out", "layouts.txt", "--shapes", "512x512"],
}


def _start(name: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *SCRIPTS[name]], cwd=cwd,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ended_with_one_line(proc: subprocess.Popen, name: str) -> None:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"{name}: interrupted"), err


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_importing_ends_with_one_line(tmp_path, name, signum):
    proc = _start(name, tmp_path)
    time.sleep(0.4)  # torch is still importing
    proc.send_signal(signum)
    _ended_with_one_line(proc, name)
    assert list(tmp_path.iterdir()) == []


# One signal each: both take the same handler from run() on (the importing test above sends both).
@pytest.mark.parametrize(("name", "signum"), [("bench_layer_norm", signal.SIGINT), ("coverage_audit", signal.SIGTERM)])
def test_a_signal_while_working_ends_with_one_line(tmp_path, name, signum):
    proc = _start(name, tmp_path)
    assert proc.stdout.readline(), "the script printed no progress"
    time.sleep(0.5)
    proc.send_signal(signum)
    _ended_with_one_line(proc, name)


def _run_script(tmp_path: Path, name: str, body: str) -> subprocess.Popen:
    """A script `name` of `body` under scripts/_interrupts.run(main), started."""
    script = tmp_path / f"{name}.py"
    script.write_text(f"import os, signal, sys, time\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
                      "import _interrupts\n\n" + body + "\n_interrupts.run(main)\n")
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_signal_inside_a_finalizer_still_ends_the_script(tmp_path):
    # A signal handled while a __del__ runs (the runtimes close their GPU handles in one):
    # raised there, Python would print it, drop it and carry on to the end of the work.
    proc = _run_script(tmp_path, "finalizer", (
        "class Handle:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n\n"
        "def main():\n"
        "    Handle()\n"
        "    time.sleep(10)\n"
        "    return 0\n"))
    _ended_with_one_line(proc, "finalizer")  # no "Exception ignored" traceback either


def test_a_signal_while_a_set_of_files_takes_its_names_lets_the_set_finish(tmp_path):
    # The signal comes between the first file's rename and the second's: the set is written
    # whole (not a new .pte beside its old coverage file), and then the script ends.
    for name in ("first", "second"):
        (tmp_path / name).write_text("old")
    proc = _run_script(tmp_path, "pair", (
        "from pipeline import ioutil\n"
        "rename = os.replace\n\n"
        "def replace(tmp, path):\n"
        "    rename(tmp, path)\n"
        "    if str(path).endswith('first'):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n\n"
        "def main():\n"
        "    os.replace = replace\n"
        "    ioutil.write_files_atomic([('first', b'new', None), ('second', b'new', None)])\n"
        "    time.sleep(10)\n"
        "    return 0\n"))
    _ended_with_one_line(proc, "pair")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "pair.py", "second"]
    assert (tmp_path / "first").read_text() == (tmp_path / "second").read_text() == "new"


def test_a_signal_inside_a_weakref_callback_still_ends_the_script(tmp_path):
    # Python drops an exception raised in a weakref callback (a WeakValueDictionary's entry
    # removal, while a model is built): it comes again, with no "Exception ignored" lines.
    proc = _run_script(tmp_path, "callback", (
        "import weakref\n\n"
        "class Value:\n"
        "    pass\n\n"
        "def removed(ref):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n\n"
        "def main():\n"
        "    value = Value()\n"
        "    ref = weakref.ref(value, removed)\n"
        "    del value\n"
        "    time.sleep(10)\n"
        "    return 0\n"))
    _ended_with_one_line(proc, "callback")


def test_a_signal_during_an_import_comes_after_it(tmp_path):
    # The module's body runs whole (an extension that imports from C++ could not pass the
    # exception back), then the script ends.
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.2)\n"
        "open('imported', 'w').close()\n")
    proc = _run_script(tmp_path, "importing", (
        "def main():\n"
        "    sys.path.insert(0, os.getcwd())\n"
        "    import slow_module\n"
        "    time.sleep(10)\n"
        "    return 0\n"))
    _ended_with_one_line(proc, "importing")
    assert (tmp_path / "imported").exists()
