"""Output into a pipe whose reader has gone (``gpuquota ... | head``), and Ctrl-C: the command ends as
``cat`` or ``kubectl`` do, killed by the signal (exit status 141 or 130 in the shell), quietly: no
traceback, no message, and never exit 1, which is the "findings" or "refused" status."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

GPUQUOTA = Path(sys.executable).parent / "gpuquota"
SIGPIPE_STATUS = 141  # 128 + SIGPIPE, as a shell reports a command the signal ended
PODS = 1000  # well over a pipe's 64 KiB buffer in every output below


def many_pods(path: Path) -> Path:
    documents = [f"""apiVersion: v1
kind: Pod
metadata: {{name: training-job-with-a-long-name-{index:05d}, namespace: team-vision}}
spec:
  containers:
  - name: main
    image: trainer
    resources: {{limits: {{nvidia.com/gpu: 2}}}}
""" for index in range(PODS)]
    path.write_text("---\n".join(documents))
    return path


@pytest.mark.parametrize("arguments", [["audit"], ["audit", "-o", "json"], ["convert"], ["convert", "-o", "json"]],
                         ids=" ".join)
def test_a_closed_pipe_ends_the_command_quietly_with_the_shells_status(tmp_path: Path, arguments: list[str]) -> None:
    manifest = many_pods(tmp_path / "pods.yaml")
    bash = shutil.which("bash")
    assert bash is not None
    # head reads one line and exits: every later write of the command meets a closed pipe.
    script = f'"$0" "$@" -f {manifest} 2>{tmp_path}/stderr | head -n 1 >/dev/null; echo "${{PIPESTATUS[0]}}"'

    result = subprocess.run([bash, "-c", script, str(GPUQUOTA), *arguments], capture_output=True, text=True,
                            timeout=120, check=True)

    # What the command says on stderr before its output (convert's notes), and nothing more.
    notes = subprocess.run([str(GPUQUOTA), *arguments, "-f", str(manifest)], capture_output=True, text=True,
                           timeout=120).stderr
    assert (result.stdout, (tmp_path / "stderr").read_text()) == (f"{SIGPIPE_STATUS}\n", notes)


def test_ctrl_c_ends_the_command_as_interrupted_not_as_findings() -> None:
    """Killed by SIGINT (130 in the shell, a script's loop stops), without click's "Aborted!" and exit 1."""
    # As at a terminal, SIGINT's default disposition: a test run started in the background of a
    # non-interactive shell inherits SIGINT ignored, and so would the command.
    process = subprocess.Popen([str(GPUQUOTA), "audit", "-f", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Past start-up and waiting for its input: blocked in read(2) (syscall 0 on x86-64, 63 on
        # arm64) on standard input (fd 0).
        deadline = time.monotonic() + 60
        while not reading_stdin(process.pid):
            assert time.monotonic() < deadline and process.poll() is None, "never came to read stdin"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()

    assert (process.returncode, out, err) == (-signal.SIGINT, b"", b"")


def reading_stdin(pid: int) -> bool:
    try:
        number, fd = Path(f"/proc/{pid}/syscall").read_text().split()[:2]
    except (OSError, ValueError):
        return False
    return number in ("0", "63") and fd == "0x0"
